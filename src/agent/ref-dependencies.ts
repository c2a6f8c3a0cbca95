// Which Secrets and ConfigMaps each VMI's seed depends on, learned from what
// its render read: each reconcile reads through a reader of its own (the
// object cache, never the API once an object is read), and what it read
// becomes the VMI's dependencies. When one of them changes the VMIs that
// depend on it are enqueued, at most once per `minIntervalMs` each: a
// Secret rewritten every 100 ms costs a VMI a handful of re-renders a
// second, not ten, and the first change of a quiet object goes at once.
import type { RefResolver, VmiObject } from '../api/objects.ts';
import type { DependencyStatus, ObjectCache, RefReader } from '../kube/object-watches.ts';
import { keyOf } from '../kube/vmi-source.ts';
import type { RenderSeed } from './deps.ts';

export const CHANGE_MIN_INTERVAL_MS = 250;

export interface RefDependenciesOptions {
  cache: ObjectCache;
  enqueue: (key: string) => void;
  // Is the VMI still one this agent seeds (a reconcile that rendered nothing
  // keeps its dependencies unless the VMI is gone or elsewhere).
  isHere: (key: string) => boolean;
  minIntervalMs?: number;
  now?: () => number;
}

interface Session {
  reader: RefReader;
  rendered: boolean;
}

export class RefDependencies {
  readonly #o: RefDependenciesOptions;
  readonly #sessions = new Map<string, Session>();
  // Changes seen per key: part of its version, so a key parked on a
  // terminal error (bad data in a Secret) runs again when the Secret does.
  readonly #changes = new Map<string, number>();
  readonly #lastEnqueue = new Map<string, number>();
  readonly #timers = new Map<string, NodeJS.Timeout>();
  #stopped = false;

  constructor(options: RefDependenciesOptions) {
    this.#o = options;
    options.cache.onChange((users) => {
      for (const key of users) this.#changed(key);
    });
  }

  // Reads during `run` go to the key's reader; what they read is kept.
  async around<T>(key: string, run: () => Promise<T>): Promise<T> {
    const session: Session = { reader: this.#o.cache.reader(key), rendered: false };
    this.#sessions.set(key, session);
    try {
      return await run();
    } finally {
      this.#sessions.delete(key);
      if (session.rendered) this.#o.cache.use(key, session.reader.read());
      else if (!this.#o.isHere(key)) this.#o.cache.release(key);
      session.reader.done();
    }
  }

  // The render, reading through the reconcile's reader.
  wrapRender(render: RenderSeed): RenderSeed {
    return async (vmi: VmiObject, refs: RefResolver, options, context) => {
      const session = this.#sessions.get(keyOf(vmi));
      if (!session) return render(vmi, refs, options, context);
      session.rendered = true;
      return render(vmi, session.reader, options, context);
    };
  }

  // The key's dependency changes so far, or undefined before the first.
  versionOf(key: string): string | undefined {
    const n = this.#changes.get(key);
    return n === undefined ? undefined : String(n);
  }

  dependencies(key: string): DependencyStatus[] {
    return this.#o.cache.dependencies(key);
  }

  /** The VMI ended: nothing of it is watched any more. */
  forget(key: string): void {
    this.#o.cache.release(key);
    this.#changes.delete(key);
    this.#lastEnqueue.delete(key);
    clearTimeout(this.#timers.get(key));
    this.#timers.delete(key);
  }

  /** Whether the VMI's change count, enqueue pacing or dependencies are held. */
  holds(key: string): boolean {
    return (
      this.#changes.has(key) ||
      this.#lastEnqueue.has(key) ||
      this.#timers.has(key) ||
      this.#o.cache.dependencies(key).length > 0
    );
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    for (const t of this.#timers.values()) clearTimeout(t);
    this.#timers.clear();
    await this.#o.cache.stop();
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : performance.now();
  }

  #changed(key: string): void {
    if (this.#stopped) return;
    this.#changes.set(key, (this.#changes.get(key) ?? 0) + 1);
    if (this.#timers.has(key)) return;
    const interval = this.#o.minIntervalMs ?? CHANGE_MIN_INTERVAL_MS;
    const wait = (this.#lastEnqueue.get(key) ?? -Infinity) + interval - this.#now();
    if (wait <= 0) {
      this.#fire(key);
      return;
    }
    const t = setTimeout(() => {
      this.#timers.delete(key);
      this.#fire(key);
    }, wait);
    t.unref();
    this.#timers.set(key, t);
  }

  #fire(key: string): void {
    if (this.#stopped) return;
    this.#lastEnqueue.set(key, this.#now());
    this.#o.enqueue(key);
  }
}
