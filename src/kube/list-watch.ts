// List, then watch from the list's resourceVersion, keeping a cache by
// namespace and name: the informer loop of client-node's ListWatch
// (@kubernetes/client-node 2.0.1, its src/cache.ts), step for step, so the
// informer behaves as it did on it. Owned here because that module's only
// use of the rest of the package (serialising the label selector, a string)
// loads every generated model class with it: ~1,000 modules at start.
//
// The lifecycle around it (restart after errors, watchdog, bounded watches)
// is kube-vmi-source.ts's and watch.ts's.
import { setTimeout as delay } from 'node:timers/promises';
import type { ObjectMeta } from '../api/objects.ts';
import type { DoneCallback, WatchCallback } from './watch.ts';

export interface ListedObject {
  metadata: Pick<ObjectMeta, 'name' | 'namespace' | 'resourceVersion'>;
}

/** A list answer: its items and the resourceVersion to watch from. */
export interface ObjectList<T> {
  metadata?: { resourceVersion?: string };
  items: T[];
}

/** What the loop needs of a watch: BoundedWatch's shape. */
export interface Watcher {
  watch(
    path: string,
    query: Record<string, string>,
    callback: WatchCallback,
    done: DoneCallback,
  ): Promise<{ abort(): void }>;
}

type ObjectHandler<T> = (obj: T) => void;
type ErrorHandler = (err: unknown) => void;
type Cache<T> = Map<string, Map<string, T>>;

// A watch the server ended without an event since the last one is watched
// again after a delay that doubles from 1 s to 30 s.
const BASE_RECONNECT_DELAY_MS = 1000;
const MAX_RECONNECT_DELAY_MS = 30_000;

/**
 * An informer loop: list, then watch from the list's resourceVersion,
 * keeping a cache by namespace and name; re-lists after a 410, and stops
 * on any other error, reported to its owner, which restarts it.
 */
export class ListWatch<T extends ListedObject> {
  readonly #path: string;
  readonly #watch: Watcher;
  readonly #list: () => Promise<ObjectList<T>>;
  readonly #labelSelector: string | undefined;
  readonly #handlers = {
    add: [] as Array<ObjectHandler<T>>,
    update: [] as Array<ObjectHandler<T>>,
    delete: [] as Array<ObjectHandler<T>>,
    error: [] as ErrorHandler[],
  };
  #objects: Cache<T> = new Map();
  #resourceVersion = '';
  #request: { abort(): void } | undefined;
  #stopped = false;
  #reconnectDelayMs = 0;
  #hasConnected = false;

  constructor(path: string, watch: Watcher, list: () => Promise<ObjectList<T>>, labelSelector?: string) {
    this.#path = path;
    this.#watch = watch;
    this.#list = list;
    this.#labelSelector = labelSelector;
  }

  on(verb: 'add' | 'update' | 'delete', handler: ObjectHandler<T>): void;
  on(verb: 'error', handler: ErrorHandler): void;
  on(verb: 'add' | 'update' | 'delete' | 'error', handler: ObjectHandler<T> | ErrorHandler): void {
    (this.#handlers[verb] as Array<ObjectHandler<T> | ErrorHandler>).push(handler);
  }

  // Keeps the resourceVersion: a start after stop() watches from there.
  async start(): Promise<void> {
    this.#stopped = false;
    this.#reconnectDelayMs = 0;
    this.#hasConnected = false;
    await this.#done(null);
  }

  stop(): Promise<void> {
    this.#stopped = true;
    this.#abort();
    return Promise.resolve();
  }

  get(name: string, namespace?: string): T | undefined {
    return this.#objects.get(namespace || '')?.get(name);
  }

  list(): T[] {
    const all: T[] = [];
    for (const byName of this.#objects.values()) all.push(...byName.values());
    return all;
  }

  #abort(): void {
    this.#request?.abort();
    this.#request = undefined;
  }

  #emitError(err: unknown): void {
    for (const h of this.#handlers.error.slice()) h(err);
  }

  // A watch ended (or the first start): 410 Gone relists, a watch cut past
  // its timeout is renewed at once, any other error stops the loop and is
  // reported (its owner, e.g. kube-vmi-source.ts, restarts it).
  async #done(err: unknown): Promise<void> {
    this.#abort();
    const e = err as { statusCode?: number; code?: number; name?: string } | null;
    if (e && (e.statusCode === 410 || e.code === 410)) {
      this.#resourceVersion = '';
    } else if (e && e.name === 'TimeoutError') {
      // The timeout already spaced the watches out; a delay would leave a
      // quiet resource unwatched.
      this.#reconnectDelayMs = 0;
    } else if (e) {
      this.#emitError(err);
      return;
    }
    if (this.#stopped) return;
    if (!this.#resourceVersion) {
      let list: ObjectList<T>;
      try {
        list = await this.#list();
      } catch (listErr) {
        this.#emitError(listErr);
        return;
      }
      this.#deleteMissing(list.items);
      for (const obj of list.items ?? []) this.#addOrUpdate(obj);
      this.#resourceVersion = list.metadata?.resourceVersion || '';
    }
    const query: Record<string, string> = { resourceVersion: this.#resourceVersion };
    if (this.#labelSelector !== undefined) query.labelSelector = this.#labelSelector;
    if (this.#reconnectDelayMs > 0 && this.#hasConnected) await delay(this.#reconnectDelayMs);
    if (this.#hasConnected) {
      this.#reconnectDelayMs = Math.min(
        this.#reconnectDelayMs > 0 ? this.#reconnectDelayMs * 2 : BASE_RECONNECT_DELAY_MS,
        MAX_RECONNECT_DELAY_MS,
      );
    }
    this.#hasConnected = true;
    this.#request = await this.#watch.watch(
      this.#path,
      query,
      (phase, obj) => this.#onEvent(phase, obj as T & { code?: number }),
      (doneErr) => void this.#done(doneErr),
    );
  }

  #onEvent(phase: string, obj: T & { code?: number }): void {
    switch (phase) {
      case 'ERROR':
        // The watch ends after it; its done() relists.
        if (obj.code === 410) this.#resourceVersion = '';
        return;
      case 'ADDED':
      case 'MODIFIED':
        this.#addOrUpdate(obj);
        break;
      case 'DELETED':
        this.#delete(obj);
        break;
    }
    this.#reconnectDelayMs = 0;
    this.#resourceVersion = obj.metadata?.resourceVersion || '';
  }

  // A relist: what the cache holds and the list does not is deleted.
  #deleteMissing(items: T[] | undefined): void {
    const listed: Cache<T> = new Map();
    for (const obj of items ?? []) {
      const ns = obj.metadata.namespace || '';
      const byName = listed.get(ns) ?? listed.set(ns, new Map()).get(ns)!;
      byName.set(obj.metadata.name || '', obj);
    }
    const handlers = this.#handlers.delete.slice();
    for (const [ns, byName] of this.#objects) {
      const now = listed.get(ns);
      if (now) {
        for (const [name, old] of byName) {
          if (now.has(name)) continue;
          byName.delete(name);
          for (const h of handlers) h(old);
        }
      } else {
        this.#objects.delete(ns);
        for (const old of byName.values()) for (const h of handlers) h(old);
      }
    }
  }

  #addOrUpdate(obj: T): void {
    const ns = obj.metadata.namespace || '';
    const byName = this.#objects.get(ns) ?? this.#objects.set(ns, new Map()).get(ns)!;
    const name = obj.metadata.name || '';
    const found = byName.get(name);
    if (!found) {
      byName.set(name, obj);
      for (const h of this.#handlers.add.slice()) h(obj);
    } else if (!sameVersion(found, obj)) {
      byName.set(name, obj);
      for (const h of this.#handlers.update.slice()) h(obj);
    }
  }

  #delete(obj: T): void {
    const ns = obj.metadata.namespace || '';
    const byName = this.#objects.get(ns);
    if (!byName?.delete(obj.metadata.name || '')) return;
    for (const h of this.#handlers.delete.slice()) h(obj);
    if (byName.size === 0) this.#objects.delete(ns);
  }
}

function sameVersion(a: ListedObject, b: ListedObject): boolean {
  const rv = a.metadata.resourceVersion;
  return rv !== undefined && rv !== null && rv === b.metadata.resourceVersion;
}
