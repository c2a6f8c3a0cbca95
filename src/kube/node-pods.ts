// This node's pods from the Kubernetes API (a list/watch with fieldSelector
// spec.nodeName=<node>, which Pods support), by UID: their IPs as the
// kubelet reports them (status.podIPs), names and owners. The datasource
// ties a VMI's requests to its launcher pod's address with it, never to an
// address the guest reported. Requests read the Map; nothing here calls the
// API per request.
import type { Logger } from 'pino';
import type { KubeApi } from './api-client.ts';
import { statusError } from './api-client.ts';
import { ListWatch, type ObjectList, type Watcher } from './list-watch.ts';

/** A pod as NodePodWatch holds it. */
export interface WatchedPod {
  uid: string;
  name: string;
  namespace: string;
  owners: string[];
  ips: string[];
}

type Listed = PodObject & { metadata: { name: string; namespace: string } };

interface PodObject {
  metadata: {
    name?: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    ownerReferences?: Array<{ uid?: unknown }>;
  };
  status?: { podIP?: unknown; podIPs?: Array<{ ip?: unknown }> };
}

// After a failed list or watch: the cache stays as it was (addresses of
// pods that went meanwhile are at worst refused, never given to another
// VMI: a new pod with a recycled IP is not in the cache either).
const RESTART_MS = 5000;

function podOf(o: PodObject): WatchedPod | undefined {
  const m = o.metadata;
  if (!m?.uid || !m.name || !m.namespace) return undefined;
  const ips = new Set<string>();
  for (const p of Array.isArray(o.status?.podIPs) ? o.status.podIPs : []) {
    if (typeof p?.ip === 'string' && p.ip !== '') ips.add(p.ip.toLowerCase());
  }
  if (typeof o.status?.podIP === 'string' && o.status.podIP !== '') ips.add(o.status.podIP.toLowerCase());
  const owners = (m.ownerReferences ?? []).map((r) => r?.uid).filter((u): u is string => typeof u === 'string');
  return { uid: m.uid, name: m.name, namespace: m.namespace, owners, ips: [...ips] };
}

/**
 * This node's pods by UID, kept by a Pod list/watch on spec.nodeName;
 * `revision` moves on every change. start() returns at once; errors restart
 * the watch after a pause.
 */
export class NodePodWatch {
  readonly #byUid = new Map<string, WatchedPod>();
  readonly #uidByName = new Map<string, string>();
  readonly #informers: Array<ListWatch<Listed>>;
  readonly #logger: Logger;
  #revision = 0;
  #stopped = false;
  readonly #timers = new Set<NodeJS.Timeout>();

  // namespaces: the agent's --namespaces (one watch in each, which the
  // namespaced RoleBindings grant); absent: one cluster-wide watch.
  constructor(options: { api: KubeApi; watcher: Watcher; nodeName: string; logger: Logger; namespaces?: string[] }) {
    this.#logger = options.logger;
    const fieldSelector = `spec.nodeName=${options.nodeName}`;
    const watcher: Watcher = {
      watch: (p, query, callback, done) => options.watcher.watch(p, { ...query, fieldSelector }, callback, done),
    };
    const paths = options.namespaces?.map((ns) => `/api/v1/namespaces/${encodeURIComponent(ns)}/pods`) ?? [
      '/api/v1/pods',
    ];
    this.#informers = paths.map((path) => {
      const list = async (): Promise<ObjectList<Listed>> => {
        const url = `${path}?fieldSelector=${encodeURIComponent(fieldSelector)}`;
        const res = await options.api.request('GET', url);
        if (res.status !== 200) throw statusError('GET', url, res);
        const body = res.body as ObjectList<Listed>;
        return { ...body, items: body.items ?? [] };
      };
      const informer = new ListWatch(path, watcher, list);
      informer.on('add', (o) => this.#put(o));
      informer.on('update', (o) => this.#put(o));
      informer.on('delete', (o) => this.#delete(o));
      informer.on('error', (e) => this.#failed(informer, e));
      return informer;
    });
  }

  get revision(): number {
    return this.#revision;
  }

  get(uid: string): WatchedPod | undefined {
    return this.#byUid.get(uid);
  }

  start(): void {
    this.#stopped = false;
    for (const informer of this.#informers) this.#start(informer);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await Promise.all(this.#informers.map((i) => i.stop()));
  }

  #start(informer: ListWatch<Listed>): void {
    void informer.start().catch((e: unknown) => this.#failed(informer, e));
  }

  #failed(informer: ListWatch<Listed>, e: unknown): void {
    if (this.#stopped) return;
    this.#logger.warn({ err: { message: (e as Error)?.message } }, 'pod watch failed; restarting');
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      if (!this.#stopped) this.#start(informer);
    }, RESTART_MS);
    timer.unref();
    this.#timers.add(timer);
  }

  #put(o: PodObject): void {
    const key = `${o.metadata.namespace}/${o.metadata.name}`;
    const old = this.#uidByName.get(key);
    if (old !== undefined) this.#byUid.delete(old);
    const pod = podOf(o);
    if (pod === undefined) this.#uidByName.delete(key);
    else {
      this.#byUid.set(pod.uid, pod);
      this.#uidByName.set(key, pod.uid);
    }
    this.#revision++;
  }

  #delete(o: PodObject): void {
    const key = `${o.metadata.namespace}/${o.metadata.name}`;
    const old = this.#uidByName.get(key);
    if (old === undefined) return;
    this.#uidByName.delete(key);
    this.#byUid.delete(old);
    this.#revision++;
  }
}
