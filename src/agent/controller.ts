// The agent: a VMI source feeding keys into the work queue, the reconciler
// draining it, garbage collection after the first full list, a periodic
// resync, and a graceful stop.
import type { VmiObject } from '../api/objects.ts';
import type { StatusReport } from './vmi-status.ts';
import { adoptedInfo } from '../cloudinit/kubevirt/adopted.ts';
import type { Logger } from 'pino';
import type { RefResolver } from '../api/objects.ts';
import type { InjectionTarget, Injector } from '../libvirt/injector-contract.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { BackoffPolicy } from '../core/backoff.ts';
import type { AgentRenderOptions, BuildSeedImage, RenderSeed, SeedImageStore } from './deps.ts';
import type { EventRecorder } from './events.ts';
import { nodeOf, Reconciler } from './reconciler.ts';
import { DomainWaits, type DomainEvents } from './domain/waits.ts';
import { AgentSeedDirectory } from '../datasource/directory.ts';
import type { NodePods } from '../datasource/types.ts';
import { ShutdownDeadline } from './shutdown.ts';
import { StatusStore } from './status-store.ts';
import { asPerVmiState, VmiRecords } from './vmi-records.ts';
import type { VmiSource, KeyHandler } from '../kube/vmi-source.ts';
import { WorkQueue } from './work-queue.ts';
import type { ReportPlanner } from './provisioning/report-plan.ts';
import type { HostNumaReader } from '../libvirt/host-numa.ts';
import type { ObjectCache } from '../kube/object-watches.ts';
import { RefDependencies } from './ref-dependencies.ts';
import { SeedReadWatch, type SeedReadClient, type SeedReadPolicy } from './domain/seed-read.ts';
import { ProvisioningTracker, seedReadAt } from './provisioning/tracker.ts';
import type { KubeApi } from '../kube/api-client.ts';
import { annotationValue, PROVISIONING_ANNOTATION, provisioningSummary } from './provisioning/summary.ts';
import {
  VmiAnnotationWriter,
  type VmiAnnotationWriterOptions,
  type WantedAnnotation,
} from './provisioning/annotation-writer.ts';

/**
 * What an Agent is built from (commands/agent/agent-command.ts fills it for cluster or local
 * mode); the optional members switch features on.
 */
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
  // KubeVirt: this node's pods, so the datasource answers a VMI only from its
  // launcher pod's address (SeedDirectory.launcherAt).
  nodePods?: NodePods;
  // Local mode: show VMIs whose node is another one as skipped (with the
  // reason) instead of ignoring them; a cluster's informer never lists them.
  reportOtherNodes?: boolean;
  // ConfigDrive `devices`: host devices' NUMA facts (host-numa.ts).
  hostNuma?: HostNumaReader;
  // Cluster mode: referenced Secrets and ConfigMaps read through a watched
  // cache; a change re-reconciles the VMIs that read them.
  objectCache?: ObjectCache;
  // Libvirt's start events and block statistics: when each domain started,
  // and when its guest first read our disk (seed-read.ts).
  seedReads?: SeedReadClient;
  seedReadPolicy?: SeedReadPolicy;
  // KubeVirt without the admission webhook: warn about vmseed VMIs that
  // start unpaused (SEED_GATE_MISSING).
  warnMissingGate?: boolean;
  // After the guest read its seed, how long without a cloud-init event
  // before the status page says "progress not reported" (tests).
  provisioningNotReportedAfterMs?: number;
  // Whether and where each seed asks cloud-init to report its progress.
  reportPlan?: ReportPlanner;
  // The seed gate of VMIs served over HTTP only (KubeVirt's unpause).
  openServedGate?: (target: InjectionTarget, signal: AbortSignal) => Promise<boolean>;
  // Cluster mode: keep each VMI's provisioning summary in its annotation
  // vmseed.io/provisioning (provisioning/summary.ts, provisioning/annotation-writer.ts), through this client.
  annotateVmis?: { api: KubeApi } & Pick<VmiAnnotationWriterOptions, 'minIntervalMs' | 'sweepMs' | 'forbiddenRetryMs'>;
  // The stop deadline (armed by stop()): each reconcile's steps get a
  // signal that follows it, and the clients made for reconciles (virsh
  // children, libvirt and API calls) listen to it too. Default: the
  // agent's own.
  shutdown?: ShutdownDeadline;
}

/**
 * The node agent: the VMI source feeds keys to the work queue, the reconciler
 * drains it. start() opens the queue after the first list and garbage
 * collection; stop() drains within its deadline, then cancels.
 */
export class Agent {
  readonly source: VmiSource;
  readonly queue: WorkQueue;
  readonly reconciler: Reconciler;
  readonly status: StatusStore;
  // Everything held about each VMI, and the registry of the per-VMI tables
  // beside it: the reconciler's end(key) drops all of it.
  readonly records = new VmiRecords();
  readonly events: EventRecorder;
  readonly shutdown: ShutdownDeadline;
  // The datasource server's SeedDirectory (undefined when it is off).
  readonly seeds: AgentSeedDirectory | undefined;
  // What each VMI's guest reported of its provisioning (the datasource's
  // progress reports), or why nothing was.
  readonly provisioning: ProvisioningTracker;
  readonly annotations: VmiAnnotationWriter | undefined;
  readonly #o: AgentOptions;
  readonly #log: Logger;
  readonly #waits: DomainWaits | undefined;
  readonly dependencies: RefDependencies | undefined;
  readonly #seedReads: SeedReadWatch | undefined;
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
    this.shutdown = options.shutdown ?? new ShutdownDeadline();
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
    const deps = (this.dependencies = this.#makeDependencies());
    this.queue = new WorkQueue({
      concurrency: options.concurrency,
      backoff: options.retryBackoff ?? { baseMs: 500, maxMs: 5 * 60_000 },
      handler: (key) =>
        deps ? deps.around(key, () => this.reconciler.reconcile(key)) : this.reconciler.reconcile(key),
      versionOf: (key) => versionWithDependencies(this.source.get(key)?.metadata.resourceVersion, deps?.versionOf(key)),
      ...(options.metrics ? { metrics: options.metrics } : {}),
      onBackoff: (key, attempt, delayMs) => this.status.backoff(key, attempt, delayMs),
    });
    options.metrics?.setLiveProbes({
      queue: () => ({
        longestRunningSeconds: this.queue.longestRunningSeconds(),
        unfinishedSeconds: this.queue.unfinishedSeconds(),
      }),
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
    this.provisioning = this.#makeProvisioning();
    this.annotations = options.annotateVmis ? this.#makeAnnotations(options.annotateVmis) : undefined;
    this.seeds = options.nocloudHttp
      ? new AgentSeedDirectory({
          onFetch: (key, uid, file, at) => {
            this.status.recordFetch(key, uid, file, at);
            this.provisioning.fetched(key, uid, file, at);
            if (file === 'meta-data') this.annotations?.touch(key);
          },
          nodeName: options.nodeName,
          ...(options.nodePods ? { pods: options.nodePods } : {}),
          onSeededAfterBoot: (key, uid, missedAt, servedAt) =>
            this.reconciler.seededAfterBootOverHttp(key, uid, missedAt, servedAt),
        })
      : undefined;
    this.#seedReads =
      options.seedReads && options.injector
        ? new SeedReadWatch({
            client: options.seedReads,
            records: this.records,
            onChange: (key, facts) => {
              this.reconciler.seedRead(key, facts);
              this.annotations?.touch(key);
            },
            logger: options.logger.child({ component: 'seed-read' }),
            ...(options.seedReadPolicy ? { policy: options.seedReadPolicy } : {}),
          })
        : undefined;
    this.#registerPerVmiState();
    this.reconciler = this.#makeReconciler(injector, refs);
    if (deps) this.status.setDependencySource((key) => deps.dependencies(key));
  }

  // Every table that holds something per VMI outside its record, told when
  // the reconciler ends the VMI (the status store registers itself; the
  // provisioning tracker keys by record and goes with it).
  #registerPerVmiState(): void {
    const r = this.records;
    r.register('queue', this.queue);
    if (this.seeds) r.register('seeds', this.seeds);
    if (this.#waits) r.register('domain-waits', this.#waits);
    if (this.dependencies) r.register('ref-dependencies', this.dependencies);
    if (this.#seedReads) r.register('seed-reads', this.#seedReads);
    if (this.annotations) r.register('annotations', this.annotations);
    const injector = asPerVmiState(this.#o.injector);
    if (injector) r.register('injector', injector);
    const events = asPerVmiState(this.events);
    if (events) r.register('events', events);
  }

  #makeProvisioning(): ProvisioningTracker {
    const o = this.#o;
    const tracker = new ProvisioningTracker({
      records: this.records,
      vmiOf: (key) => this.source.get(key),
      events: o.events,
      ...(o.metrics ? { metrics: o.metrics } : {}),
      logger: o.logger.child({ component: 'provisioning' }),
      onChange: (key) => this.annotations?.touch(key),
      ...(o.provisioningNotReportedAfterMs !== undefined
        ? { notReportedAfterMs: o.provisioningNotReportedAfterMs }
        : {}),
    });
    this.status.setProvisioningSource((r, now) => tracker.status(r, now));
    o.metrics?.setLiveProbes({ provisioning: () => tracker.summary(Date.now()) });
    return tracker;
  }

  #makeAnnotations(o: NonNullable<AgentOptions['annotateVmis']>): VmiAnnotationWriter {
    const writer = new VmiAnnotationWriter({
      ...o,
      annotation: PROVISIONING_ANNOTATION,
      wanted: (key, now) => this.#wantedAnnotation(key, now),
      keys: () => [...this.records.values()].map((r) => r.key),
      logger: this.#log.child({ component: 'vmi-annotations' }),
      ...(this.#o.metrics ? { metrics: this.#o.metrics } : {}),
    });
    this.status.addDegradedCheck(() => writer.degraded());
    return writer;
  }

  // Only VMIs running on this node: during a migration the target's agent
  // leaves the annotation to the source's, and after it the other way round.
  #wantedAnnotation(key: string, now: number): WantedAnnotation | undefined {
    const vmi = this.source.get(key);
    const r = this.records.get(key);
    const uid = vmi?.metadata.uid;
    if (!vmi || !r || !uid || r.status?.uid !== uid || nodeOf(vmi) !== this.#o.nodeName) return undefined;
    const summary = provisioningSummary(this.provisioning.status(r, now), seedReadAt(r));
    if (!summary) return undefined;
    return {
      namespace: vmi.metadata.namespace ?? 'default',
      name: vmi.metadata.name,
      uid,
      value: annotationValue(summary),
      current: vmi.metadata.annotations?.[PROVISIONING_ANNOTATION],
    };
  }

  #makeDependencies(): RefDependencies | undefined {
    const cache = this.#o.objectCache;
    if (!cache) return undefined;
    const deps = new RefDependencies({
      cache,
      enqueue: (key) => this.#enqueue(key),
      isHere: (key) => {
        const vmi = this.source.get(key);
        return vmi !== undefined && this.reconciler.isHere(vmi);
      },
    });
    return deps;
  }

  #makeReconciler(injector: Injector | undefined, refs: RefResolver): Reconciler {
    const options = this.#o;
    return new Reconciler({
      nodeName: options.nodeName,
      cache: this.source,
      refs,
      render: this.dependencies ? this.dependencies.wrapRender(options.render) : options.render,
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
      ...(this.#seedReads ? { seedReads: this.#seedReads } : {}),
      shutdown: this.shutdown,
      ...(options.reportPlan ? { reportPlan: options.reportPlan } : {}),
      ...(options.warnMissingGate ? { warnMissingGate: true } : {}),
      ...(options.openServedGate ? { openServedGate: options.openServedGate } : {}),
    });
  }

  // Handlers only enqueue, and never throw.
  #enqueue(key: string): void {
    if (this.#stopping) return;
    this.reconciler.changed(key);
    const vmi = this.source.get(key);
    // New on the status page as pending until its first reconcile.
    if (vmi && this.status.get(key)?.uid !== vmi.metadata.uid)
      this.status.write(key, vmi.metadata.uid ?? key, seen(vmi));
    if (this.#held) {
      this.#held.add(key);
      return;
    }
    this.queue.add(key);
  }

  // Resolves once the first list is in and garbage collection ran.
  async start(): Promise<void> {
    // Before any watch: a start event is never missed for want of a listener.
    this.#seedReads?.start();
    this.#waits?.start();
    await this.source.start();
    await this.source.synced();
    if (this.#stopping) return;
    for (const key of this.source.keys()) {
      const vmi = this.source.get(key);
      if (vmi) this.status.write(key, vmi.metadata.uid ?? key, seen(vmi));
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
    this.annotations?.start();
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

  // Stop taking work, let in-flight reconciles finish within the deadline;
  // past it they are cancelled and have CANCEL_GRACE_MS to settle.
  async stop(deadlineMs = 10_000): Promise<boolean> {
    this.#stopping = true;
    this.shutdown.arm(deadlineMs);
    if (this.#resync) clearInterval(this.#resync);
    this.#waits?.stop();
    this.#seedReads?.stop();
    await this.source.stop();
    const finished = await this.queue.shutdown(this.shutdown.reconciles);
    await this.dependencies?.stop();
    this.stopOutcome = 'finished';
    if (finished) this.shutdown.drained();
    else {
      const inFlight = this.queue.inFlight;
      const settled = await this.queue.shutdown(this.shutdown.settled);
      this.stopOutcome = settled ? 'cancelled' : 'abandoned';
      this.#log.warn(
        { deadlineMs, inFlight, cancelled: settled },
        settled
          ? 'reconciles in flight at the stop deadline were cancelled'
          : 'stopped with reconciles still in flight',
      );
    }
    // Its own bound, counted from here: an API server that does not answer
    // must not hold the stop, whether or not the reconciles used their time.
    await Promise.race([
      Promise.all([this.#o.events.flush(), this.annotations?.stop()]),
      new Promise((r) => setTimeout(r, Math.min(deadlineMs, 2000)).unref()),
    ]);
    return finished;
  }
}

// A terminal failure waits for the VMI or one of its Secrets/ConfigMaps to change.
function versionWithDependencies(vmi: string | undefined, deps: string | undefined): string | undefined {
  return deps === undefined ? vmi : `${vmi ?? ''}+${deps}`;
}

function seen(vmi: VmiObject): StatusReport {
  const adopted = adoptedInfo(vmi);
  return adopted ? { kind: 'seen', adopted } : { kind: 'seen' };
}
