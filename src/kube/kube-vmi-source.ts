// The node's VMIs from the Kubernetes API: a ListWatch (list-watch.ts) on
// /apis/kubevirt.io/v1/virtualmachineinstances, or, in namespaced mode
// (--namespaces a,b), one per namespace on /apis/kubevirt.io/v1/namespaces/
// <ns>/virtualmachineinstances, aggregated: synced when every watch is,
// connected when every watch is.
//
// Two watches per scope, as virt-handler has (pkg/controller/
// virtinformers.go VMISourceHost and VMITargetHost): one selects
// kubevirt.io/nodeName=<node>, the other kubevirt.io/migrationTargetNodeName=
// <node>. KubeVirt's migration controller sets the second label when the
// target pod is scheduled, while kubevirt.io/nodeName still names the
// source until the migration ends; without it a target node's agent would
// never see the VMI and could not stage its image there. A VMI is here when
// either cache holds it.
//
// Watches are bounded as client-go's reflector bounds them (watch.ts):
// the server ends each one cleanly after a randomised timeoutSeconds and
// ListWatch watches again from its resourceVersion; one that runs past it
// is cut and renewed the same way. ListWatch stops for good on any other
// error and can stall silently, so this class owns its lifecycle:
// restart after errors with capped exponential backoff (at least the
// server's Retry-After on a 429/503), restart from a watchdog when nothing
// (not even a bookmark) arrived for too long. A restart keeps the
// resourceVersion: only a 410 Gone relists.
import type { KubeConnection } from './connection.ts';
import type { Logger } from 'pino';
import type { VmiObject } from '../api/objects.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { WatchStatus } from '../status/snapshot.ts';
import { backoffDelay, type BackoffPolicy } from '../core/backoff.ts';
import { statusError, transportReason, type KubeApi } from './api-client.ts';
import { BoundedWatch, type DoneCallback, type WatchCallback, type WatchError } from './watch.ts';
import { ListWatch, type ObjectList } from './list-watch.ts';
import { VmseedError } from '../errors.ts';
import { keyOf, type KeyHandler, type VmiSource } from './vmi-source.ts';

/** The cluster-wide VMI collection; vmiPath() gives a namespace's. */
export const VMI_PATH = '/apis/kubevirt.io/v1/virtualmachineinstances';
/** The label virt-controller sets to the node a VMI runs on. */
export const NODE_NAME_LABEL = 'kubevirt.io/nodeName';
/** The label naming the node a VMI is migrating to, while it migrates. */
export const MIGRATION_TARGET_LABEL = 'kubevirt.io/migrationTargetNodeName';

// Which label a watch selects on: the VMI's node, or the node it migrates to.
type WatchRole = 'node' | 'migrationTarget';

/** The VMI collection of `namespace`, or the cluster-wide one when undefined. */
export function vmiPath(namespace?: string): string {
  return namespace === undefined
    ? VMI_PATH
    : `/apis/kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachineinstances`;
}

/**
 * What KubeVmiSource watches with and how hard. Times are milliseconds; the
 * defaults are client-go's (5 min minimum watch timeout) or the agent's
 * (restart backoff 1 s to 60 s, stale after 3 min).
 */
export interface KubeSourceOptions {
  connection: KubeConnection;
  api: KubeApi;
  nodeName: string;
  logger: Logger;
  metrics?: Metrics;
  onKey: KeyHandler;
  // Namespaced mode: watch only these (absent or empty: cluster-wide).
  namespaces?: readonly string[];
  restartBackoff?: BackoffPolicy;
  // A Retry-After longer than this is cut to it.
  maxRetryAfterMs?: number;
  // No event or bookmark for this long: the watch is stale and restarted.
  staleAfterMs?: number;
  watchdogIntervalMs?: number;
  // client-go's minWatchTimeout (5 min): each watch asks the server to end
  // it after a random time in [min, 2*min].
  minWatchTimeoutMs?: number;
  // How long past its timeoutSeconds a watch may run before it is cut.
  watchGraceMs?: number;
}

type ListError = Error & { statusCode?: number; retryAfterMs?: number };

// One ListWatch: the whole cluster or one namespace, on one label.
class ScopedInformer {
  readonly namespace: string | undefined;
  readonly role: WatchRole;
  readonly #opts: KubeSourceOptions;
  readonly #log: Logger;
  readonly #informer: ListWatch<VmiObject>;
  readonly #selector: string;
  readonly #path: string;
  readonly #restartBackoff: BackoffPolicy;
  readonly #staleAfterMs: number;
  readonly #changed: () => void;
  #synced = false;
  #syncedWaiters: Array<() => void> = [];
  connected = false;
  stale = false;
  restarts = 0;
  #failures = 0;
  lastEventAt: number | undefined;
  lastError: string | undefined;
  #stopped = true;
  #restartTimer: NodeJS.Timeout | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  // Bumped on every (re)start: done/error callbacks of older watches are ignored.
  #generation = 0;

  constructor(options: KubeSourceOptions, namespace: string | undefined, role: WatchRole, changed: () => void) {
    this.namespace = namespace;
    this.role = role;
    this.#opts = options;
    this.#changed = changed;
    this.#log = options.logger.child({
      ...(namespace === undefined ? {} : { watchNamespace: namespace }),
      ...(role === 'node' ? {} : { watch: 'migration-target' }),
    });
    this.#selector = `${role === 'node' ? NODE_NAME_LABEL : MIGRATION_TARGET_LABEL}=${options.nodeName}`;
    this.#path = vmiPath(namespace);
    this.#restartBackoff = options.restartBackoff ?? { baseMs: 1000, maxMs: 60_000 };
    this.#staleAfterMs = options.staleAfterMs ?? 180_000;
    const watch = new BoundedWatch({
      connection: options.connection,
      ...(options.minWatchTimeoutMs !== undefined ? { minWatchTimeoutMs: options.minWatchTimeoutMs } : {}),
      ...(options.watchGraceMs !== undefined ? { graceMs: options.watchGraceMs } : {}),
    });
    this.#informer = new ListWatch<VmiObject>(this.#path, this.#wrapWatch(watch), () => this.#list(), this.#selector);
    const enqueue = (obj: VmiObject) => {
      try {
        this.#opts.onKey(keyOf(obj));
      } catch (e) {
        this.#log.error({ err: { message: (e as Error).message } }, 'enqueue failed');
      }
    };
    this.#informer.on('add', enqueue);
    this.#informer.on('update', enqueue);
    this.#informer.on('delete', enqueue);
    this.#informer.on('error', (err: unknown) => this.#onError(err));
  }

  get synced(): boolean {
    return this.#synced;
  }

  // Notes every line (bookmarks included) for the watchdog, tracks
  // connection state and drops callbacks of watches we aborted ourselves.
  // A clean end (the server's timeoutSeconds) or a watch cut past its
  // timeout is a renewal, not a disconnection: ListWatch watches again
  // from its resourceVersion at once.
  #wrapWatch(watch: BoundedWatch) {
    return {
      watch: async (path: string, query: Record<string, string>, callback: WatchCallback, done: DoneCallback) => {
        const gen = this.#generation;
        let aborted = false;
        let finished = false;
        const handle = await watch.watch(
          path,
          query,
          (phase, obj, raw) => {
            if (aborted || gen !== this.#generation) return;
            this.#sawEvent();
            if (phase === 'ERROR') {
              const code = (obj as { code?: number })?.code;
              this.#log.info({ code }, 'watch ended by the API server with an ERROR event');
              if (code === 410) this.#opts.metrics?.informerRestarts.inc({ reason: 'gone' });
            }
            callback(phase, obj, raw);
          },
          (err) => {
            finished = true;
            if (aborted || gen !== this.#generation) return;
            const e = err as WatchError | null;
            if (e === null || e.name === 'TimeoutError') {
              if (e)
                this.#log.info(
                  { reason: e.message },
                  'VMI watch ran past its timeout; renewing it from its resourceVersion',
                );
              else this.#log.debug('VMI watch ended by the API server; renewing it from its resourceVersion');
            } else {
              this.connected = false;
              this.#changed();
              if (e.statusCode === 410) this.#opts.metrics?.informerRestarts.inc({ reason: 'gone' });
            }
            done(err);
          },
        );
        // Stopped or restarted while this watch was connecting: ListWatch
        // had no handle to abort yet, so the stream would stay open.
        if (gen !== this.#generation && !finished) {
          aborted = true;
          handle.abort();
        }
        if (!finished && !aborted && gen === this.#generation) {
          this.connected = true;
          this.#failures = 0;
          this.lastError = undefined;
          this.#changed();
        }
        return {
          abort: () => {
            aborted = true;
            handle.abort();
          },
        };
      },
    };
  }

  async #list(): Promise<ObjectList<VmiObject>> {
    const path = `${this.#path}?labelSelector=${encodeURIComponent(this.#selector)}`;
    const res = await this.#opts.api.request('GET', path);
    if (res.status !== 200) {
      const err = statusError('GET', path, res) as ListError;
      err.statusCode = res.status;
      if (res.retryAfterMs !== undefined) err.retryAfterMs = res.retryAfterMs;
      throw err;
    }
    this.#sawEvent();
    const list = res.body as ObjectList<VmiObject>;
    // ListWatch adds the items after this promise resolves, synchronously.
    setImmediate(() => this.#markSynced());
    return { ...list, items: list.items ?? [] };
  }

  #markSynced(): void {
    if (this.#synced) return;
    this.#synced = true;
    this.#changed();
    const w = this.#syncedWaiters;
    this.#syncedWaiters = [];
    for (const f of w) f();
    this.#log.info({ vmis: this.keys().length }, 'VMI informer synced');
  }

  #sawEvent(): void {
    this.lastEventAt = Date.now();
    if (this.stale) this.#log.info('VMI watch is receiving again');
    this.stale = false;
    this.#failures = 0;
  }

  #onError(err: unknown): void {
    if (this.#stopped) return;
    this.connected = false;
    this.#failures++;
    const e = err as { message?: string; statusCode?: number; retryAfterMs?: number };
    this.lastError = (
      err instanceof VmseedError
        ? err.message
        : e?.statusCode
          ? (e.message ?? `HTTP ${e.statusCode}`)
          : transportReason(err)
    ).slice(0, 300);
    this.#changed();
    const backoff = backoffDelay(this.#restartBackoff, this.#failures);
    // The server asked for a pause (429 from priority and fairness, 503).
    const delay =
      typeof e?.retryAfterMs === 'number'
        ? Math.max(backoff, Math.min(e.retryAfterMs, this.#opts.maxRetryAfterMs ?? 60_000))
        : backoff;
    this.#log.warn({ error: this.lastError, retryInMs: delay }, 'VMI watch failed; restarting');
    this.#scheduleRestart('error', delay);
  }

  #scheduleRestart(reason: 'error' | 'stale', delay: number): void {
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      void this.#restart(reason);
    }, delay);
  }

  async #restart(reason: 'error' | 'stale'): Promise<void> {
    if (this.#stopped) return;
    this.restarts++;
    this.#opts.metrics?.informerRestarts.inc({ reason });
    this.#generation++;
    await this.#informer.stop();
    this.connected = false;
    if (this.#stopped) return;
    // ListWatch.start() keeps its resourceVersion: a watch from there, no relist.
    await this.#informer.start().catch((e: unknown) => this.#onError(e));
  }

  async start(): Promise<void> {
    this.#stopped = false;
    this.lastEventAt = Date.now();
    const interval = this.#opts.watchdogIntervalMs ?? Math.max(50, Math.min(10_000, this.#staleAfterMs / 4));
    this.#watchdog = setInterval(() => this.#checkStale(), interval);
    this.#generation++;
    await this.#informer.start().catch((e: unknown) => this.#onError(e));
  }

  #checkStale(): void {
    this.#changed();
    if (this.#stopped || this.#restartTimer) return;
    const age = this.lastEventAt === undefined ? 0 : Date.now() - this.lastEventAt;
    if (age > this.#staleAfterMs) {
      this.stale = true;
      this.#log.warn({ secondsSinceLastEvent: Math.round(age / 1000) }, 'VMI watch is stale; restarting it');
      this.lastEventAt = Date.now();
      this.#scheduleRestart('stale', 0);
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#generation++;
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
    if (this.#watchdog) clearInterval(this.#watchdog);
    this.#restartTimer = undefined;
    this.#watchdog = undefined;
    await this.#informer.stop();
    this.connected = false;
    this.#changed();
  }

  get(namespace: string, name: string): VmiObject | undefined {
    return this.#informer.get(name, namespace);
  }

  keys(): string[] {
    return this.#informer.list().map((o) => keyOf(o));
  }

  whenSynced(): Promise<void> {
    if (this.#synced) return Promise.resolve();
    return new Promise((r) => this.#syncedWaiters.push(r));
  }
}

/**
 * Both labels can name this node at once (a migration between two launcher
 * pods of this node, or the moment one to this node completes): both caches
 * hold the VMI, each at the version its own watch last delivered, and the
 * later one wins. resourceVersions are opaque to clients in general; the
 * API server's are etcd revisions, and anything else falls back to `a`, the
 * node watch's copy.
 */
export function newerVmi(a: VmiObject | undefined, b: VmiObject | undefined): VmiObject | undefined {
  if (!a || !b) return a ?? b;
  const [ra, rb] = [a.metadata.resourceVersion, b.metadata.resourceVersion];
  if (ra === undefined || rb === undefined || !/^\d{1,19}$/.test(ra) || !/^\d{1,19}$/.test(rb)) return a;
  return BigInt(rb) > BigInt(ra) ? b : a;
}

/**
 * The node's VMIs from the API server, as the module comment describes: two
 * watches per scope, restarted on errors and by a watchdog. status() feeds
 * the status page and vmseed_informer_synced.
 */
export class KubeVmiSource implements VmiSource {
  readonly #opts: KubeSourceOptions;
  readonly #informers: ScopedInformer[];
  // Scope (namespace, or '' cluster-wide) → its node watch and migration-target watch.
  readonly #byScope: Map<string, readonly [ScopedInformer, ScopedInformer]>;
  readonly #clusterWide: boolean;

  constructor(options: KubeSourceOptions) {
    this.#opts = options;
    const namespaces = [...new Set(options.namespaces ?? [])];
    const changed = () => this.#publish();
    this.#clusterWide = namespaces.length === 0;
    const scopes: Array<string | undefined> = this.#clusterWide ? [undefined] : namespaces;
    this.#byScope = new Map(
      scopes.map((ns) => [
        ns ?? '',
        [
          new ScopedInformer(options, ns, 'node', changed),
          new ScopedInformer(options, ns, 'migrationTarget', changed),
        ] as const,
      ]),
    );
    this.#informers = [...this.#byScope.values()].flat();
  }

  // vmseed_informer_synced: every scope listed and watching, none stale.
  #publish(): void {
    const s = this.status();
    this.#opts.metrics?.informerSynced.set(s.synced && s.connected && !s.stale ? 1 : 0);
    if (s.lastEventAt !== undefined)
      this.#opts.metrics?.informerLastEventAge.set(Math.max(0, (Date.now() - Date.parse(s.lastEventAt)) / 1000));
  }

  async start(): Promise<void> {
    await Promise.all(this.#informers.map((i) => i.start()));
  }

  async stop(): Promise<void> {
    await Promise.all(this.#informers.map((i) => i.stop()));
  }

  get(key: string): VmiObject | undefined {
    const i = key.indexOf('/');
    const namespace = key.slice(0, i);
    const pair = this.#byScope.get(this.#clusterWide ? '' : namespace);
    if (!pair) return undefined;
    const name = key.slice(i + 1);
    return newerVmi(pair[0].get(namespace, name), pair[1].get(namespace, name));
  }

  keys(): string[] {
    return [...new Set(this.#informers.flatMap((i) => i.keys()))];
  }

  synced(): Promise<void> {
    return Promise.all(this.#informers.map((i) => i.whenSynced())).then(() => undefined);
  }

  status(): WatchStatus {
    const all = this.#informers;
    const times = all.map((i) => i.lastEventAt).filter((t): t is number => t !== undefined);
    const failing = all.find((i) => i.lastError !== undefined);
    const where = [
      failing?.namespace === undefined ? '' : `namespace ${failing.namespace}`,
      failing?.role === 'migrationTarget' ? 'migration-target watch' : '',
    ]
      .filter((w) => w !== '')
      .join(', ');
    const lastError =
      failing === undefined ? undefined : where === '' ? failing.lastError : `${where}: ${failing.lastError}`;
    return {
      mode: 'kubernetes',
      synced: all.every((i) => i.synced),
      connected: all.every((i) => i.connected),
      stale: all.some((i) => i.stale),
      restarts: all.reduce((n, i) => n + i.restarts, 0),
      // The oldest: the watchdog's view of the quietest watch.
      ...(times.length > 0 ? { lastEventAt: new Date(Math.min(...times)).toISOString() } : {}),
      ...(lastError !== undefined ? { lastError } : {}),
    };
  }
}
