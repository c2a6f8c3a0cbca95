// The node's VMIs from the Kubernetes API: client-node's ListWatch on
// /apis/kubevirt.io/v1/virtualmachineinstances with the label selector
// kubevirt.io/nodeName=<node>. client-node's informer stops for good on any
// error other than 410 and can stall silently, so this class owns its
// lifecycle: restart after errors with capped exponential backoff, restart
// from a watchdog when nothing (not even a bookmark) arrived for too long.
// Deep imports: the package index loads every generated API client.
import { ListWatch } from '@kubernetes/client-node/dist/cache.js';
import { Watch } from '@kubernetes/client-node/dist/watch.js';
import type { KubernetesObject, KubernetesListObject } from '@kubernetes/client-node/dist/types.js';
import type { KubeConnection } from './kube-connection.ts';
import type { Logger } from 'pino';
import type { VmiObject } from '../cloudinit/kube-types.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { WatchStatus } from './status-types.ts';
import { backoffDelay, type BackoffPolicy } from './backoff.ts';
import { statusError, type KubeApi } from './kube-api.ts';
import { VmseedError } from '../errors.ts';
import { keyOf, type KeyHandler, type VmiSource } from './vmi-source.ts';

export const VMI_PATH = '/apis/kubevirt.io/v1/virtualmachineinstances';

export interface KubeSourceOptions {
  connection: KubeConnection;
  api: KubeApi;
  nodeName: string;
  logger: Logger;
  metrics?: Metrics;
  onKey: KeyHandler;
  restartBackoff?: BackoffPolicy;
  // No event or bookmark for this long: the watch is stale and restarted.
  staleAfterMs?: number;
  watchdogIntervalMs?: number;
  // client-node's per-watch inactivity timeout; above staleAfterMs so the
  // watchdog is what notices.
  watchTimeoutMs?: number;
}

type WatchCallback = (phase: string, apiObj: unknown, watchObj?: unknown) => void;
type DoneCallback = (err: unknown) => void;

export class KubeVmiSource implements VmiSource {
  readonly #opts: KubeSourceOptions;
  readonly #log: Logger;
  readonly #informer: ListWatch<KubernetesObject>;
  readonly #selector: string;
  readonly #restartBackoff: BackoffPolicy;
  readonly #staleAfterMs: number;
  #synced = false;
  #syncedWaiters: Array<() => void> = [];
  #connected = false;
  #stale = false;
  #restarts = 0;
  #failures = 0;
  #lastEventAt: number | undefined;
  #lastError: string | undefined;
  #stopped = true;
  #restartTimer: NodeJS.Timeout | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  // Bumped on every (re)start: done/error callbacks of older watches are ignored.
  #generation = 0;

  constructor(options: KubeSourceOptions) {
    this.#opts = options;
    this.#log = options.logger;
    this.#selector = `kubevirt.io/nodeName=${options.nodeName}`;
    this.#restartBackoff = options.restartBackoff ?? { baseMs: 1000, maxMs: 60_000 };
    this.#staleAfterMs = options.staleAfterMs ?? 180_000;
    // Watch only calls getCurrentCluster() and applySecurityAuthentication().
    const watch = new Watch(options.connection as never);
    // Private in the typings, but the only knob for client-node's inactivity timeout.
    (watch as unknown as { requestTimeoutMs: number }).requestTimeoutMs = options.watchTimeoutMs ?? this.#staleAfterMs * 2;
    this.#informer = new ListWatch<KubernetesObject>(VMI_PATH, this.#wrapWatch(watch) as unknown as Watch, () => this.#list(), false, this.#selector);
    const enqueue = (obj: KubernetesObject) => {
      try {
        this.#opts.onKey(keyOf(obj as VmiObject));
      } catch (e) {
        this.#log.error({ err: { message: (e as Error).message } }, 'enqueue failed');
      }
    };
    this.#informer.on('add', enqueue);
    this.#informer.on('update', enqueue);
    this.#informer.on('delete', enqueue);
    this.#informer.on('error', (err: unknown) => this.#onError(err));
  }

  // Intercepts client-node's Watch: adds allowWatchBookmarks, notes every
  // line (bookmarks included) for the watchdog, tracks connection state and
  // drops callbacks of watches we aborted ourselves (client-node would
  // otherwise report the abort as an error, or abort the next watch).
  #wrapWatch(watch: Watch) {
    return {
      watch: async (path: string, query: Record<string, unknown>, callback: WatchCallback, done: DoneCallback) => {
        const gen = this.#generation;
        let aborted = false;
        let finished = false;
        const controller = await watch.watch(
          path,
          { ...query, allowWatchBookmarks: true },
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
            this.#connected = false;
            this.#publishSynced();
            if (aborted || gen !== this.#generation) return;
            if (err && ((err as { statusCode?: number }).statusCode === 410 || (err as { code?: number }).code === 410)) {
              this.#opts.metrics?.informerRestarts.inc({ reason: 'gone' });
            }
            done(err);
          },
        );
        if (!finished && !aborted && gen === this.#generation) {
          this.#connected = true;
          this.#failures = 0;
          this.#lastError = undefined;
          this.#publishSynced();
        }
        return {
          abort: () => {
            aborted = true;
            controller.abort();
          },
        };
      },
    };
  }

  async #list(): Promise<KubernetesListObject<KubernetesObject>> {
    const path = `${VMI_PATH}?labelSelector=${encodeURIComponent(this.#selector)}`;
    const res = await this.#opts.api.request('GET', path);
    if (res.status !== 200) {
      const err = statusError('GET', path, res.status) as Error & { statusCode?: number };
      err.statusCode = res.status;
      throw err;
    }
    this.#sawEvent();
    const list = res.body as KubernetesListObject<KubernetesObject>;
    // client-node adds the items after this promise resolves, synchronously.
    setImmediate(() => this.#markSynced());
    return { ...list, items: list.items ?? [] };
  }

  // vmseed_informer_synced: listed and watching, and not stale.
  #publishSynced(): void {
    this.#opts.metrics?.informerSynced.set(this.#synced && this.#connected && !this.#stale ? 1 : 0);
  }

  #markSynced(): void {
    if (this.#synced) return;
    this.#synced = true;
    this.#publishSynced();
    const w = this.#syncedWaiters;
    this.#syncedWaiters = [];
    for (const f of w) f();
    this.#log.info({ vmis: this.keys().length }, 'VMI informer synced');
  }

  #sawEvent(): void {
    this.#lastEventAt = Date.now();
    if (this.#stale) this.#log.info('VMI watch is receiving again');
    this.#stale = false;
    this.#failures = 0;
  }

  #onError(err: unknown): void {
    if (this.#stopped) return;
    this.#connected = false;
    this.#publishSynced();
    this.#failures++;
    const e = err as { message?: string; code?: unknown; statusCode?: number; cause?: { code?: string } };
    this.#lastError = (
      err instanceof VmseedError
        ? err.message
        : (e?.cause?.code ?? (typeof e?.code === 'string' ? e.code : undefined) ?? (e?.statusCode ? `HTTP ${e.statusCode}` : undefined) ?? e?.message ?? 'unknown error')
    ).slice(0, 200);
    const delay = backoffDelay(this.#restartBackoff, this.#failures);
    this.#log.warn({ error: this.#lastError, retryInMs: delay }, 'VMI watch failed; restarting');
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
    this.#restarts++;
    this.#opts.metrics?.informerRestarts.inc({ reason });
    this.#generation++;
    await this.#informer.stop();
    this.#connected = false;
    if (this.#stopped) return;
    await this.#informer.start().catch((e: unknown) => this.#onError(e));
  }

  async start(): Promise<void> {
    this.#stopped = false;
    this.#lastEventAt = Date.now();
    const interval = this.#opts.watchdogIntervalMs ?? Math.max(50, Math.min(10_000, this.#staleAfterMs / 4));
    this.#watchdog = setInterval(() => this.#checkStale(), interval);
    this.#generation++;
    await this.#informer.start().catch((e: unknown) => this.#onError(e));
  }

  #checkStale(): void {
    const age = this.#lastEventAt === undefined ? 0 : (Date.now() - this.#lastEventAt) / 1000;
    this.#opts.metrics?.informerLastEventAge.set(age);
    this.#publishSynced();
    if (this.#stopped || this.#restartTimer) return;
    if (age * 1000 > this.#staleAfterMs) {
      this.#stale = true;
      this.#log.warn({ secondsSinceLastEvent: Math.round(age) }, 'VMI watch is stale; restarting it');
      this.#lastEventAt = Date.now();
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
    this.#connected = false;
    this.#publishSynced();
  }

  get(key: string): VmiObject | undefined {
    const i = key.indexOf('/');
    return this.#informer.get(key.slice(i + 1), key.slice(0, i)) as VmiObject | undefined;
  }

  keys(): string[] {
    return this.#informer.list().map((o) => keyOf(o as VmiObject));
  }

  synced(): Promise<void> {
    if (this.#synced) return Promise.resolve();
    return new Promise((r) => this.#syncedWaiters.push(r));
  }

  status(): WatchStatus {
    return {
      mode: 'kubernetes',
      synced: this.#synced,
      connected: this.#connected,
      stale: this.#stale,
      restarts: this.#restarts,
      ...(this.#lastEventAt !== undefined ? { lastEventAt: new Date(this.#lastEventAt).toISOString() } : {}),
      ...(this.#lastError !== undefined ? { lastError: this.#lastError } : {}),
    };
  }
}
