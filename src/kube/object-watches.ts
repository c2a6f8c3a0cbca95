// The Secrets and ConfigMaps the node's seeds reference, each read once and
// then kept current by a watch of its own, as kubelet keeps the ones its pods
// mount (pkg/kubelet/util/manager/watch_based_manager.go): a watch per
// object (fieldSelector=metadata.name=<name> in its namespace, which RBAC
// authorizes as `watch` on that one name), shared by every VMI that reads
// it, stopped when the last one stops reading it, and none at all for an
// object marked immutable. Reconciles read the cache, never the API: after
// the first read of an object the API server only streams its changes.
//
// Reads happen in a reader() per reconcile, which pins what it reads; use()
// then makes that set what the VMI depends on. A change is reported with the
// VMIs that depend on (or are reading) the object.
//
// A watch the server ends at its timeoutSeconds, or one cut past it, is
// renewed from the last resourceVersion without a read (a read per renewal
// would cost every object a GET every few minutes at rest). 410 Gone (the
// resourceVersion is no longer served: also the first watch of an object
// unchanged for longer than the server keeps history) is answered, after a
// random moment, by a watch without resourceVersion, which the server starts
// with the object as it is then (ADDED) and then its changes, and once that
// watch is open by one GET: a watch of an object that does not exist says
// nothing, and only the read tells a deletion missed while no watch was open.
// The read is applied only if no event came while it was in flight, since
// such an event may be newer than it (and tells the truth itself). So
// a deletion (or re-creation) at any moment of the 410 window ends as the
// API server has it. Any other failure is answered by a renewal after a
// capped, jittered backoff.
import type { Logger } from 'pino';
import type { ConfigMapObject, RefResolver, SecretObject } from '../api/objects.ts';
import { backoffDelay, type BackoffPolicy } from '../core/backoff.ts';
import { VmseedError } from '../errors.ts';
import { statusError, type KubeApi } from './api-client.ts';
import type { Watcher } from './list-watch.ts';
import type { WatchError } from './watch.ts';

/** The kinds of object a seed may reference. */
export type RefKind = 'Secret' | 'ConfigMap';

/** One referenced object, by kind, namespace and name (refKey() gives its cache key). */
export interface RefId {
  kind: RefKind;
  namespace: string;
  name: string;
}

/** What the status page shows of one dependency. */
export interface DependencyStatus extends RefId {
  // exists: the last read or event had it; absent: 404 or DELETED.
  state: 'exists' | 'absent' | 'unknown';
  // Read once and not watched (immutable: true).
  immutable: boolean;
  // When this agent last saw it change (its first read, then each event).
  changedAt?: string;
}

/**
 * A reader for one reconcile: a RefResolver whose reads are remembered and
 * pinned in the cache until done().
 */
export interface RefReader extends RefResolver {
  // The objects read so far (in the order first read).
  read(): RefId[];
  // Unpins what it read; call after use().
  done(): void;
}

/**
 * What the agent needs of the watches (a fake in its tests). `user` is the
 * VMI's key; onChange handlers get the users of an object that changed.
 */
export interface ObjectCache {
  reader(user: string): RefReader;
  use(user: string, refs: readonly RefId[]): void;
  release(user: string): void;
  dependencies(user: string): DependencyStatus[];
  onChange(handler: (users: readonly string[]) => void): void;
  stop(): Promise<void>;
}

/** How ObjectWatches reads, watches and bounds; times in milliseconds. */
export interface ObjectWatchesOptions {
  api: KubeApi;
  // BoundedWatch (watch.ts): server-side timeoutSeconds, cut past a grace.
  watcher: Watcher;
  logger: Logger;
  // Namespaced mode: objects elsewhere are refused before any call.
  namespaces?: readonly string[];
  // Distinct objects one VMI may read (each is a watch).
  maxPerVmi?: number;
  // Renewal after a failed watch.
  backoff?: BackoffPolicy;
  // The fresh read after 410 Gone waits a random moment up to this.
  goneReadSpreadMs?: number;
  random?: () => number;
  now?: () => number;
  // Open watches changed (vmseed_object_watches).
  onWatchCount?: (n: number) => void;
}

/**
 * A VMI references a handful (user-data, network-data, vendor-data, a few
 * files); 64 covers any sane spec while bounding one tenant's watches.
 */
export const MAX_OBJECTS_PER_VMI = 64;
/** Renewal after a failed watch: 1 s, doubling (jittered) to 60 s. */
export const DEFAULT_WATCH_BACKOFF: BackoffPolicy = { baseMs: 1000, maxMs: 60_000 };
/**
 * After 410 Gone the fresh read waits a random moment up to this: an API
 * server that restarts hands every watch of every node a 410 at once, and
 * the reads that answer it are spread instead of arriving together.
 */
export const GONE_READ_SPREAD_MS = 2000;

type RefObject = SecretObject | ConfigMapObject;

/** The cache key of a referenced object (NUL-separated, so no name can collide). */
export function refKey(r: RefId): string {
  return `${r.kind}\0${r.namespace}\0${r.name}`;
}

function collectionPath(r: RefId): string {
  return `/api/v1/namespaces/${encodeURIComponent(r.namespace)}/${r.kind === 'Secret' ? 'secrets' : 'configmaps'}`;
}

class Entry {
  readonly id: RefId;
  readonly users = new Set<string>();
  // Readers holding it: user → count.
  readonly pins = new Map<string, number>();
  object: RefObject | undefined;
  resourceVersion = '';
  loaded = false;
  immutable = false;
  changedAt: number | undefined;
  loading: Promise<void> | undefined;
  loadError: unknown;
  watch: { abort(): void } | undefined;
  watching = false;
  failures = 0;
  // Object events received: a read answered with none in between is current.
  events = 0;
  // After 410: the state read before it is not known to hold until a read
  // made while a watch is open confirms it (made even when an event came
  // first, so a 410 costs one read, always).
  unconfirmed = false;
  // The read that would confirm it: in flight (or waiting to be tried
  // again), and which one (a later 410 makes an earlier read moot).
  confirmPending = false;
  confirmSeq = 0;
  timer: NodeJS.Timeout | undefined;
  // Bumped when the entry is dropped or its watch replaced: late callbacks are ignored.
  generation = 0;
  dropped = false;

  constructor(id: RefId) {
    this.id = id;
  }

  get held(): boolean {
    return this.users.size > 0 || this.pins.size > 0;
  }

  holders(): string[] {
    return [...new Set([...this.users, ...this.pins.keys()])];
  }
}

/**
 * The ObjectCache over the API server, as the module comment describes.
 * A reader's reads throw KUBE_API_FORBIDDEN (terminal) outside `namespaces`,
 * REFERENCES_TOO_MANY (terminal) past `maxPerVmi` objects, CANCELLED once
 * stopped, and the read's own error when the first GET fails.
 */
export class ObjectWatches implements ObjectCache {
  readonly #o: ObjectWatchesOptions;
  readonly #log: Logger;
  readonly #entries = new Map<string, Entry>();
  // user → the keys of what it depends on.
  readonly #uses = new Map<string, Set<string>>();
  readonly #handlers: Array<(users: readonly string[]) => void> = [];
  readonly #namespaces: ReadonlySet<string> | undefined;
  readonly #max: number;
  #open = 0;
  #stopped = false;

  constructor(options: ObjectWatchesOptions) {
    this.#o = options;
    this.#log = options.logger;
    this.#max = options.maxPerVmi ?? MAX_OBJECTS_PER_VMI;
    this.#namespaces = options.namespaces && options.namespaces.length > 0 ? new Set(options.namespaces) : undefined;
  }

  onChange(handler: (users: readonly string[]) => void): void {
    this.#handlers.push(handler);
  }

  // Open watches: one per mutable object some VMI depends on.
  get openWatches(): number {
    return this.#open;
  }

  // Objects held in the cache (watched or immutable).
  get cachedObjects(): number {
    return this.#entries.size;
  }

  reader(user: string): RefReader {
    const read = new Map<string, RefId>();
    const pinned: Entry[] = [];
    const get = async (id: RefId): Promise<RefObject | undefined> => {
      if (this.#stopped)
        throw new VmseedError('CANCELLED', 'the agent is stopping; the read was cancelled', { kind: 'retryable' });
      this.#checkScope(id);
      const k = refKey(id);
      if (!read.has(k)) {
        if (read.size >= this.#max) throw tooMany(user, this.#max, id);
        read.set(k, id);
        const e = this.#entry(id);
        e.pins.set(user, (e.pins.get(user) ?? 0) + 1);
        pinned.push(e);
      }
      return this.#value(this.#entries.get(k)!);
    };
    return {
      getSecret: async (namespace, name) =>
        (await get({ kind: 'Secret', namespace, name })) as SecretObject | undefined,
      getConfigMap: async (namespace, name) =>
        (await get({ kind: 'ConfigMap', namespace, name })) as ConfigMapObject | undefined,
      read: () => [...read.values()],
      done: () => {
        for (const e of pinned.splice(0)) {
          const n = (e.pins.get(user) ?? 1) - 1;
          if (n > 0) e.pins.set(user, n);
          else e.pins.delete(user);
          this.#dropIfUnheld(e);
        }
      },
    };
  }

  use(user: string, refs: readonly RefId[]): void {
    const next = new Set<string>();
    for (const id of refs.slice(0, this.#max)) {
      const k = refKey(id);
      next.add(k);
      this.#entry(id).users.add(user);
    }
    const before = this.#uses.get(user);
    if (next.size > 0) this.#uses.set(user, next);
    else this.#uses.delete(user);
    for (const k of before ?? []) {
      if (next.has(k)) continue;
      const e = this.#entries.get(k);
      if (!e) continue;
      e.users.delete(user);
      this.#dropIfUnheld(e);
    }
  }

  release(user: string): void {
    this.use(user, []);
  }

  dependencies(user: string): DependencyStatus[] {
    const out: DependencyStatus[] = [];
    for (const k of this.#uses.get(user) ?? []) {
      const e = this.#entries.get(k);
      if (!e) continue;
      out.push({
        ...e.id,
        state: !e.loaded ? 'unknown' : e.object ? 'exists' : 'absent',
        immutable: e.immutable,
        ...(e.changedAt !== undefined ? { changedAt: new Date(e.changedAt).toISOString() } : {}),
      });
    }
    return out;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    for (const e of this.#entries.values()) this.#drop(e);
    this.#entries.clear();
    this.#uses.clear();
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  #checkScope(id: RefId): void {
    if (this.#namespaces && !this.#namespaces.has(id.namespace)) {
      throw new VmseedError(
        'KUBE_API_FORBIDDEN',
        `${id.kind} ${id.namespace}/${id.name} is outside the agent's namespaces (--namespaces ${[...this.#namespaces].join(',')}); not read`,
        { kind: 'terminal' },
      );
    }
  }

  #entry(id: RefId): Entry {
    const k = refKey(id);
    let e = this.#entries.get(k);
    if (!e) {
      e = new Entry(id);
      this.#entries.set(k, e);
    }
    return e;
  }

  // The cached object, after the first read (shared by concurrent readers;
  // a failed one is tried again by the next reader).
  async #value(e: Entry): Promise<RefObject | undefined> {
    if (!e.loaded) {
      e.loading ??= this.#load(e).finally(() => (e.loading = undefined));
      await e.loading;
      if (!e.loaded) throw e.loadError;
    }
    return e.object;
  }

  // GET: the object and the resourceVersion to watch from; then the watch.
  async #load(e: Entry): Promise<void> {
    const path = `${collectionPath(e.id)}/${encodeURIComponent(e.id.name)}`;
    let object: RefObject | undefined;
    try {
      const res = await this.#o.api.request('GET', path);
      if (res.status === 404) object = undefined;
      else if (res.status === 200) object = res.body as RefObject;
      else throw statusError('GET', path, res);
    } catch (err) {
      e.loadError = err;
      return;
    }
    if (e.dropped) return;
    const first = !e.loaded;
    e.loaded = true;
    e.loadError = undefined;
    this.#set(e, object, first);
    e.resourceVersion = object?.metadata.resourceVersion ?? '';
    this.#startWatch(e);
  }

  // A new state for the object; users hear of it unless it is the first read.
  #set(e: Entry, object: RefObject | undefined, first: boolean): void {
    const before = e.object;
    const changed =
      first ||
      (before === undefined) !== (object === undefined) ||
      (before !== undefined && before.metadata.resourceVersion !== object?.metadata.resourceVersion);
    e.object = object;
    e.immutable = (object as { immutable?: unknown } | undefined)?.immutable === true;
    if (!changed) return;
    e.changedAt = this.#now();
    if (first) return;
    const users = e.holders();
    if (users.length === 0) return;
    for (const h of this.#handlers) h(users);
  }

  #startWatch(e: Entry): void {
    if (e.dropped || this.#stopped) return;
    if (e.immutable) {
      // kubelet's rule: an immutable object cannot change, only go away.
      this.#stopWatch(e);
      return;
    }
    const gen = ++e.generation;
    const query: Record<string, string> = { fieldSelector: `metadata.name=${e.id.name}` };
    // No resourceVersion (the object did not exist): the server starts with
    // an ADDED for whatever exists by then, so a creation in between is seen.
    if (e.resourceVersion) query.resourceVersion = e.resourceVersion;
    this.#setWatching(e, true);
    void this.#o.watcher
      .watch(
        collectionPath(e.id),
        query,
        (phase, obj) => {
          if (gen === e.generation) this.#onEvent(e, phase, obj as RefObject & { code?: number });
        },
        (err) => {
          if (gen === e.generation) this.#onWatchEnd(e, err);
        },
      )
      .then(
        (handle) => {
          if (gen !== e.generation || e.dropped) return handle.abort();
          e.watch = handle;
          if (e.unconfirmed && !e.confirmPending) void this.#confirm(e);
        },
        (err: unknown) => {
          if (gen === e.generation) this.#onWatchEnd(e, err);
        },
      );
  }

  #onEvent(e: Entry, phase: string, obj: RefObject & { code?: number }): void {
    switch (phase) {
      case 'ADDED':
      case 'MODIFIED':
        if (obj?.metadata?.name !== e.id.name) return;
        this.#heard(e);
        e.resourceVersion = obj.metadata.resourceVersion ?? e.resourceVersion;
        this.#set(e, obj, false);
        if (e.immutable) {
          e.generation++;
          this.#stopWatch(e);
        }
        return;
      case 'DELETED':
        if (obj?.metadata?.name !== e.id.name) return;
        this.#heard(e);
        e.resourceVersion = obj.metadata.resourceVersion ?? e.resourceVersion;
        this.#set(e, undefined, false);
        return;
      case 'BOOKMARK':
        e.resourceVersion = obj?.metadata?.resourceVersion ?? e.resourceVersion;
        return;
      case 'ERROR':
        // The stream ends after it; its end decides (410: read afresh).
        if (obj?.code === 410) e.resourceVersion = '';
        return;
    }
  }

  #onWatchEnd(e: Entry, err: unknown): void {
    e.watch = undefined;
    if (e.dropped || this.#stopped) return;
    const w = err as WatchError | null;
    if (w === null || w === undefined || w.name === 'TimeoutError') {
      if (e.resourceVersion) {
        this.#startWatch(e);
        return;
      }
      // An ERROR 410 event cleared the resourceVersion: read afresh.
      this.#retry(e, this.#goneSpread());
      return;
    }
    if (w.statusCode === 410) {
      e.resourceVersion = '';
      this.#retry(e, this.#goneSpread());
      return;
    }
    e.failures++;
    const delay = this.#jittered(backoffDelay(this.#o.backoff ?? DEFAULT_WATCH_BACKOFF, e.failures));
    const wait = w.retryAfterMs !== undefined ? Math.max(delay, Math.min(w.retryAfterMs, 60_000)) : delay;
    this.#log.warn(
      {
        kind: e.id.kind,
        namespace: e.id.namespace,
        name: e.id.name,
        error: String(w.message ?? w).slice(0, 200),
        retryInMs: wait,
      },
      'watch of a referenced object failed; renewing it',
    );
    this.#setWatching(e, false);
    this.#retry(e, wait);
  }

  // After a delay: watch again from the resourceVersion, or read afresh
  // when there is none to resume from (410, or the object never existed
  // and the watch failed before its first event).
  #retry(e: Entry, ms: number): void {
    if (e.timer) clearTimeout(e.timer);
    e.generation++;
    const resume = () => {
      e.timer = undefined;
      if (e.dropped || this.#stopped) return;
      if (e.resourceVersion) this.#startWatch(e);
      else this.#reload(e);
    };
    if (ms <= 0) return resume();
    e.timer = setTimeout(resume, ms);
    e.timer.unref();
  }

  #heard(e: Entry): void {
    e.failures = 0;
    e.events++;
  }

  // After 410: watch afresh; the read follows once the watch is open.
  #reload(e: Entry): void {
    e.resourceVersion = '';
    e.unconfirmed = true;
    e.confirmSeq++;
    e.confirmPending = false;
    this.#startWatch(e);
  }

  // The read that confirms the state after 410, made while a watch is open:
  // with no event in between, what it answers is current; what changes
  // after it reaches the watch.
  async #confirm(e: Entry): Promise<void> {
    e.confirmPending = true;
    const seq = e.confirmSeq;
    const seen = e.events;
    const path = `${collectionPath(e.id)}/${encodeURIComponent(e.id.name)}`;
    try {
      const res = await this.#o.api.request('GET', path);
      if (res.status !== 200 && res.status !== 404) throw statusError('GET', path, res);
      if (e.dropped || this.#stopped || seq !== e.confirmSeq) return;
      e.confirmPending = false;
      if (e.events === seen) this.#set(e, res.status === 200 ? (res.body as RefObject) : undefined, false);
      e.unconfirmed = false;
    } catch (err) {
      if (e.dropped || this.#stopped || seq !== e.confirmSeq) return;
      e.failures++;
      const wait = this.#jittered(backoffDelay(this.#o.backoff ?? DEFAULT_WATCH_BACKOFF, e.failures));
      this.#log.warn(
        {
          kind: e.id.kind,
          namespace: e.id.namespace,
          name: e.id.name,
          error: (err as Error).message?.slice(0, 200),
          retryInMs: wait,
        },
        'read of a referenced object failed; trying again',
      );
      const t = setTimeout(() => {
        if (seq !== e.confirmSeq || e.dropped || this.#stopped) return;
        e.confirmPending = false;
        if (e.unconfirmed) void this.#confirm(e);
      }, wait);
      t.unref();
    }
  }

  #goneSpread(): number {
    return Math.round((this.#o.random ?? Math.random)() * (this.#o.goneReadSpreadMs ?? GONE_READ_SPREAD_MS));
  }

  // Full jitter on the upper half: renewals of many objects spread out.
  #jittered(ms: number): number {
    const r = (this.#o.random ?? Math.random)();
    return Math.round(ms / 2 + (ms / 2) * r);
  }

  #dropIfUnheld(e: Entry): void {
    if (e.held) return;
    this.#entries.delete(refKey(e.id));
    this.#drop(e);
  }

  #drop(e: Entry): void {
    e.dropped = true;
    e.generation++;
    if (e.timer) clearTimeout(e.timer);
    e.timer = undefined;
    this.#stopWatch(e);
  }

  #stopWatch(e: Entry): void {
    e.watch?.abort();
    e.watch = undefined;
    this.#setWatching(e, false);
  }

  #setWatching(e: Entry, on: boolean): void {
    if (e.watching === on) return;
    e.watching = on;
    this.#open += on ? 1 : -1;
    this.#o.onWatchCount?.(this.#open);
  }
}

function tooMany(user: string, max: number, id: RefId): VmseedError {
  return new VmseedError(
    'REFERENCES_TOO_MANY',
    `VMI ${user} references more than ${max} Secrets and ConfigMaps (the ${max + 1}th is ${id.kind} ${id.namespace}/${id.name}); ` +
      'each is watched by the agent: merge them into fewer objects',
    { kind: 'terminal' },
  );
}
