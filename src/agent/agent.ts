// The agent: a VMI source feeding keys into the work queue, the reconciler
// draining it, garbage collection after the first full list, a periodic
// resync, and a graceful stop.
import type { Logger } from 'pino';
import type { RefResolver } from '../api/types.ts';
import type { Injector } from '../libvirt/types.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { BackoffPolicy } from '../backoff.ts';
import type { AgentRenderOptions, BuildSeedImage, RenderSeed, SeedImageStore } from './deps.ts';
import type { EventRecorder } from './events.ts';
import { Reconciler } from './reconciler.ts';
import { DomainWaits, type DomainEvents } from './domain-waits.ts';
import { AgentSeedDirectory } from './seed-directory.ts';
import { StatusStore } from './status-store.ts';
import { VmiRecords } from './vmi-records.ts';
import type { VmiSource, KeyHandler } from '../kube/vmi-source.ts';
import { WorkQueue } from './work-queue.ts';
import type { HostNumaReader } from '../libvirt/host-numa.ts';

export interface AgentOptions {
  version: string;
  nodeName: string;
  stateDir: string;
  config: Record<string, string | number | boolean>;
  // The source is made by the agent so it can hand it the enqueue function.
  makeSource: (onKey: KeyHandler) => VmiSource;
  refs: RefResolver | ((source: VmiSource) => RefResolver);
  render: RenderSeed;
  build: BuildSeedImage;
  store: SeedImageStore;
  injector?: Injector;
  // libvirt's domain events (the RPC client): a VMI waiting for its domain
  // is reconciled when the domain appears, not after its backoff.
  domainEvents?: DomainEvents;
  events: EventRecorder;
  metrics?: Metrics;
  logger: Logger;
  concurrency: number;
  renderOptions: AgentRenderOptions;
  resyncPeriodMs: number;
  retryBackoff?: BackoffPolicy;
  // How long a VMI whose render timed out MAX_RENDER_TIMEOUTS times waits
  // before the next try (tests; default RENDER_TIMEOUT_PARK_MS).
  renderTimeoutParkMs?: number;
  fsync?: boolean;
  // NoCloud over HTTP on: the agent keeps each VMI's seed for the
  // datasource (agent.seeds). Its DMI serial is shown nowhere (seed-url).
  nocloudHttp?: Record<string, never>;
  // Local mode: show VMIs whose node is another one as skipped (with the
  // reason) instead of ignoring them; a cluster's informer never lists them.
  reportOtherNodes?: boolean;
  // ConfigDrive `devices`: host devices' NUMA facts (host-numa.ts).
  hostNuma?: HostNumaReader;
  // Aborted by stop() at its deadline: the work that listens to its signal
  // (virsh children, render workers) ends, and its reconcile fails with
  // CANCELLED.
  cancel?: AbortController;
}

// After the cancel, how long stop() waits for the cancelled work to settle.
export const CANCEL_GRACE_MS = 1000;

export class Agent {
  readonly source: VmiSource;
  readonly queue: WorkQueue;
  readonly reconciler: Reconciler;
  readonly status: StatusStore;
  // Everything held about each VMI; forget(key) drops all of it.
  readonly records = new VmiRecords();
  readonly events: EventRecorder;
  // The datasource server's SeedDirectory (undefined when it is off).
  readonly seeds: AgentSeedDirectory | undefined;
  readonly #o: AgentOptions;
  readonly #log: Logger;
  readonly #waits: DomainWaits | undefined;
  // Keys seen before garbage collection ran; the queue opens after it.
  #held: Set<string> | undefined = new Set();
  #resync: NodeJS.Timeout | undefined;
  #stopping = false;
  // How stop() ended: everything finished in time, what was left was
  // cancelled and settled, or some of it was still running (abandoned).
  stopOutcome: 'finished' | 'cancelled' | 'abandoned' | undefined;

  constructor(options: AgentOptions) {
    this.#o = options;
    this.#log = options.logger;
    this.events = options.events;
    this.source = options.makeSource((key) => this.#enqueue(key));
    this.#waits =
      options.domainEvents && options.injector
        ? new DomainWaits(
            options.domainEvents,
            (key) => this.#enqueue(key),
            options.logger.child({ component: 'domain-events' }),
          )
        : undefined;
    const injector = options.injector && this.#waits ? this.#waits.wrap(options.injector) : options.injector;
    const refs = typeof options.refs === 'function' ? options.refs(this.source) : options.refs;
    this.queue = new WorkQueue({
      concurrency: options.concurrency,
      backoff: options.retryBackoff ?? { baseMs: 500, maxMs: 5 * 60_000 },
      handler: (key) => this.reconciler.reconcile(key),
      versionOf: (key) => this.source.get(key)?.metadata.resourceVersion,
      ...(options.metrics ? { metrics: options.metrics } : {}),
    });
    options.metrics?.setLiveProbes({
      longestRunningSeconds: () => this.queue.longestRunningSeconds(),
      watch: () => this.source.status(),
    });
    this.status = new StatusStore({
      version: options.version,
      nodeName: options.nodeName,
      stateDir: options.stateDir,
      config: options.config,
      ...(options.metrics ? { metrics: options.metrics } : {}),
      watch: () => this.source.status(),
      queue: () => ({ depth: this.queue.depth, inFlight: this.queue.inFlight }),
      ...(options.nocloudHttp ? { servedOverHttp: true } : {}),
      records: this.records,
    });
    this.seeds = options.nocloudHttp
      ? new AgentSeedDirectory({ onFetch: (key, uid, file, at) => this.status.recordFetch(key, uid, file, at) })
      : undefined;
    // Kept by UID and by domain, for the datasource and libvirt's events.
    this.records.onForget((key) => {
      this.seeds?.drop(key);
      this.#waits?.forget(key);
    });
    this.reconciler = this.#makeReconciler(injector, refs);
  }

  #makeReconciler(injector: Injector | undefined, refs: RefResolver): Reconciler {
    const options = this.#o;
    return new Reconciler({
      nodeName: options.nodeName,
      cache: this.source,
      refs,
      render: options.render,
      build: options.build,
      store: options.store,
      ...(injector ? { injector } : {}),
      events: options.events,
      status: this.status,
      records: this.records,
      ...(options.metrics ? { metrics: options.metrics } : {}),
      logger: options.logger.child({ component: 'reconciler' }),
      renderOptions: options.renderOptions,
      fsync: options.fsync ?? true,
      failures: (key) => this.queue.failures(key),
      ...(options.renderTimeoutParkMs !== undefined ? { renderTimeoutParkMs: options.renderTimeoutParkMs } : {}),
      ...(options.reportOtherNodes ? { reportOtherNodes: true } : {}),
      ...(options.hostNuma ? { hostNuma: options.hostNuma } : {}),
      ...(this.seeds ? { seeds: this.seeds } : {}),
    });
  }

  // Handlers only enqueue, and never throw.
  #enqueue(key: string): void {
    if (this.#stopping) return;
    const vmi = this.source.get(key);
    // New on the status page as pending until its first reconcile.
    if (vmi && this.status.get(key)?.uid !== vmi.metadata.uid)
      this.status.write(key, vmi.metadata.uid ?? key, { kind: 'seen' });
    if (this.#held) {
      this.#held.add(key);
      return;
    }
    this.queue.add(key);
  }

  // Resolves once the first list is in and garbage collection ran.
  async start(): Promise<void> {
    this.#waits?.start();
    await this.source.start();
    await this.source.synced();
    if (this.#stopping) return;
    for (const key of this.source.keys()) {
      const vmi = this.source.get(key);
      if (vmi) this.status.write(key, vmi.metadata.uid ?? key, { kind: 'seen' });
    }
    try {
      await this.reconciler.collectGarbage();
    } catch (e) {
      this.#log.error({ err: { message: (e as Error).message } }, 'garbage collection failed; continuing');
    }
    const held = this.#held ?? new Set<string>();
    this.#held = undefined;
    for (const key of this.source.keys()) held.add(key);
    for (const key of held) this.queue.add(key);
    this.#resync = setInterval(() => this.resync(), this.#o.resyncPeriodMs);
    this.#resync.unref();
  }

  // Re-enqueue every cached key: level-based reconcile makes this cheap when
  // nothing changed, and it heals anything an event was lost for.
  resync(): void {
    if (this.#held) return;
    this.source.resync?.();
    const keys = this.source.keys();
    this.#log.debug({ keys: keys.length }, 'resync');
    for (const key of keys) this.queue.add(key);
  }

  // Stop taking work, let in-flight reconciles finish within the deadline.
  async stop(deadlineMs = 10_000): Promise<boolean> {
    this.#stopping = true;
    if (this.#resync) clearInterval(this.#resync);
    this.#waits?.stop();
    await this.source.stop();
    const finished = await this.queue.shutdown(deadlineMs);
    this.stopOutcome = 'finished';
    if (!finished) {
      const inFlight = this.queue.inFlight;
      this.#o.cancel?.abort();
      const settled = this.#o.cancel ? await this.queue.shutdown(CANCEL_GRACE_MS) : false;
      this.stopOutcome = settled ? 'cancelled' : 'abandoned';
      this.#log.warn(
        { deadlineMs, inFlight, cancelled: settled },
        settled
          ? 'reconciles in flight at the stop deadline were cancelled'
          : 'stopped with reconciles still in flight',
      );
    }
    await Promise.race([this.#o.events.flush(), new Promise((r) => setTimeout(r, Math.min(deadlineMs, 2000)).unref())]);
    return finished;
  }
}
