// An agent in-process against the fake API server, with the real renderer,
// ISO builder and image store, and an injector fake that models which disk
// each domain holds (so "no second attach" is observable).
import { readdirSync, statSync, type Dirent } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pino from 'pino';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { Agent, type AgentOptions } from '../../src/agent/controller.ts';
import { KubeEventRecorder } from '../../src/agent/events.ts';
import { KubeConnectionApi, type KubeApi } from '../../src/kube/api-client.ts';
import { KubeRefResolver } from '../../src/kube/resolver.ts';
import type { KubeConnection } from '../../src/kube/connection.ts';
import { KubeVmiSource } from '../../src/kube/kube-vmi-source.ts';
import { ObjectWatches, type ObjectWatchesOptions } from '../../src/kube/object-watches.ts';
import { BoundedWatch } from '../../src/kube/watch.ts';
import { createMetrics, type Metrics } from '../../src/metrics/metrics.ts';
import type {
  EjectionResult,
  InjectionResult,
  InjectionTarget,
  Injector,
} from '../../src/libvirt/injector-contract.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { objectServiceApi } from '../../src/kube/object-service-api.ts';
import type { RenderSeed } from '../../src/agent/deps.ts';
import { captureLogger } from './capture-logger.ts';
import { FakeKube } from './fake-kube.ts';

export const NODE = 'node-a';

// The VMI's current image: names are content-addressed (the store's
// pathFor needs the sha256), so tests that only know the VMI look in its
// directory. Several images (before a prune): the newest. None: a path in
// that directory that does not exist, so `existsSync(imageOf(...))` reads
// as "the VMI has an image".
export function imageOf(
  store: ImageStore,
  v: VmiObject | { namespace: string; name: string; uid: string },
  datasource: 'nocloud' | 'configdrive' = 'nocloud',
): string {
  const key =
    'metadata' in v ? { namespace: v.metadata.namespace ?? 'default', name: v.metadata.name, uid: v.metadata.uid! } : v;
  const dir = store.dirFor(key);
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.startsWith(`${datasource}-`) && n.endsWith('.iso'));
  } catch {
    names = [];
  }
  // Each file is stat'ed once and a file pruned between the listing and the
  // stat is left out: the agent replaces images while tests poll.
  const dated = names.flatMap((n) => {
    const path = join(dir, n);
    const stat = statSync(path, { throwIfNoEntry: false });
    return stat ? [{ path, mtimeMs: stat.mtimeMs }] : [];
  });
  dated.sort((a, b) => b.mtimeMs - a.mtimeMs);
  return dated[0]?.path ?? join(dir, `${datasource}-none.iso`);
}

// The ISO files under `root` (paths relative to it, sorted), listed while an
// agent writes, replaces and prunes them: a directory or a file gone between
// being listed and being read is left out instead of failing the listing
// (a recursive readdirSync throws ENOENT then).
export function isoFilesUnder(root: string): string[] {
  const found: string[] = [];
  const walk = (rel: string) => {
    let entries: Dirent[];
    try {
      entries = readdirSync(join(root, rel), { withFileTypes: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ENOTDIR') return;
      throw e;
    }
    for (const entry of entries) {
      const path = rel ? join(rel, entry.name) : entry.name;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.iso')) found.push(path);
    }
  };
  walk('');
  return found.sort();
}

// All images the VMI's directory holds (any datasource), sorted.
export function imagesOf(store: ImageStore, v: VmiObject): string[] {
  const dir = store.dirFor({
    namespace: v.metadata.namespace ?? 'default',
    name: v.metadata.name,
    uid: v.metadata.uid!,
  });
  try {
    return readdirSync(dir)
      .filter((n) => n.endsWith('.iso') && !n.startsWith('.'))
      .map((n) => join(dir, n))
      .sort();
  } catch {
    return [];
  }
}

export interface InjectorCall {
  op: 'inject' | 'eject';
  key: string;
  uid: string;
  path?: string;
  action: string;
}

// Domains keyed by VMI uid; survives agent restarts when shared.
export class RecordingInjector implements Injector {
  readonly calls: InjectorCall[] = [];
  readonly attached = new Map<string, string>();

  async inject(t: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    const had = this.attached.get(t.uid);
    const action = had === imagePath ? 'none' : had ? 'replaced' : 'attached';
    this.attached.set(t.uid, imagePath);
    this.calls.push({ op: 'inject', key: `${t.namespace}/${t.name}`, uid: t.uid, path: imagePath, action });
    return {
      action,
      domain: `${t.namespace}_${t.name}`,
      targetDev: 'vdb',
      bus: 'virtio',
      flags: ['--config'],
      domainState: 'shutoff',
      persistent: true,
      seededAfterBoot: false,
      resumed: false,
    };
  }

  async eject(t: InjectionTarget): Promise<EjectionResult> {
    const action = this.attached.delete(t.uid) ? 'detached' : 'none';
    this.calls.push({ op: 'eject', key: `${t.namespace}/${t.name}`, uid: t.uid, action });
    return { action, domain: `${t.namespace}_${t.name}` };
  }

  actions(op: 'inject' | 'eject', action?: string): InjectorCall[] {
    return this.calls.filter((c) => c.op === op && (action === undefined || c.action === action));
  }
}

export interface Harness {
  agent: Agent;
  store: ImageStore;
  metrics: Metrics;
  // The watched cache of referenced Secrets and ConfigMaps (as the command wires it).
  watches: ObjectWatches | undefined;
  lines: string[];
  logger: pino.Logger;
  stop(): Promise<void>;
}

export async function startAgent(
  fake: FakeKube,
  options: {
    stateDir: string;
    injector?: Injector;
    // libvirt's domain events, for VMIs waiting for their domain.
    domainEvents?: AgentOptions['domainEvents'];
    staleAfterMs?: number;
    resyncPeriodMs?: number;
    restartBaseMs?: number;
    waitSynced?: boolean;
    nocloudHttp?: AgentOptions['nocloudHttp'];
    // Started on the agent before its first list (the datasource server).
    beforeStart?: (agent: Agent) => Promise<void>;
    kubevirtVolumes?: 'own' | 'ignore';
    // Namespaced mode (--namespaces).
    namespaces?: string[];
    // Instead of the real renderer.
    render?: RenderSeed;
    renderTimeoutParkMs?: number;
    // false: Secrets and ConfigMaps read at each reconcile (no watches).
    watchRefs?: boolean | (Partial<ObjectWatchesOptions> & { minWatchTimeoutMs?: number });
    // Secrets and ConfigMaps read through this connection (the agent's
    // --objects-url) instead of the fake's.
    objects?: KubeConnection;
    seedReads?: AgentOptions['seedReads'];
    seedReadPolicy?: AgentOptions['seedReadPolicy'];
    warnMissingGate?: boolean;
    provisioningNotReportedAfterMs?: number;
    reportPlan?: AgentOptions['reportPlan'];
    // Reconciles at once (default 4).
    concurrency?: number;
    // The seed gate of VMIs served over HTTP only, given the harness's API client.
    openServedGate?: (api: KubeApi) => AgentOptions['openServedGate'];
    // The VMI annotation vmseed.io/provisioning, written with the harness's API client.
    annotateVmis?: Omit<NonNullable<AgentOptions['annotateVmis']>, 'api'>;
    // Seeds checked against cloud-init's schemas (off by default).
    schemaCheck?: AgentOptions['renderOptions']['schemaCheck'];
  },
): Promise<Harness> {
  const { logger, lines } = captureLogger('debug');
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  const connection = fake.connection();
  // Well above what the fake takes even when this process is starved: a
  // request cut by its timeout is an informer restart that tests count.
  const api = new KubeConnectionApi(connection, { timeoutMs: 10_000 });
  const store = new ImageStore({ root: options.stateDir });
  const objectsConnection = options.objects ?? connection;
  const objectsApi = options.objects
    ? objectServiceApi(
        new KubeConnectionApi(options.objects, { timeoutMs: 10_000 }),
        options.objects.getCurrentCluster().server,
      )
    : api;
  const watchOptions = typeof options.watchRefs === 'object' ? options.watchRefs : {};
  const watches =
    options.watchRefs === false
      ? undefined
      : new ObjectWatches({
          api: objectsApi,
          watcher: new BoundedWatch({
            connection: objectsConnection,
            ...(watchOptions.minWatchTimeoutMs !== undefined
              ? { minWatchTimeoutMs: watchOptions.minWatchTimeoutMs }
              : {}),
          }),
          logger: logger.child({ component: 'object-watches' }),
          backoff: { baseMs: 50, maxMs: 400 },
          goneReadSpreadMs: 200,
          ...(options.namespaces ? { namespaces: options.namespaces } : {}),
          onWatchCount: (n) => metrics.objectWatches.set(n),
          ...watchOptions,
        });
  const agent = new Agent({
    version: 'test',
    nodeName: NODE,
    stateDir: options.stateDir,
    config: {},
    makeSource: (onKey) =>
      new KubeVmiSource({
        connection,
        api,
        nodeName: NODE,
        logger: logger.child({ component: 'informer' }),
        metrics,
        onKey,
        restartBackoff: { baseMs: options.restartBaseMs ?? 50, maxMs: 400 },
        staleAfterMs: options.staleAfterMs ?? 60_000,
        ...(options.namespaces ? { namespaces: options.namespaces } : {}),
      }),
    refs: new KubeRefResolver(objectsApi, options.namespaces ? { namespaces: options.namespaces } : {}),
    render: options.render ?? renderSeed,
    build: buildSeedImage,
    store,
    ...(options.injector ? { injector: options.injector } : {}),
    ...(options.domainEvents ? { domainEvents: options.domainEvents } : {}),
    events: new KubeEventRecorder({ api, logger: logger.child({ component: 'events' }), host: NODE }),
    metrics,
    logger,
    concurrency: options.concurrency ?? 4,
    renderOptions: {
      kubevirtVolumes: options.kubevirtVolumes ?? 'ignore',
      maxUserDataBytes: 1 << 20,
      maxNetworkDataBytes: 1 << 16,
      ...(options.schemaCheck ? { schemaCheck: options.schemaCheck } : {}),
    },
    resyncPeriodMs: options.resyncPeriodMs ?? 60_000,
    retryBackoff: { baseMs: 50, maxMs: 400 },
    fsync: false,
    ...(options.nocloudHttp ? { nocloudHttp: options.nocloudHttp } : {}),
    ...(options.renderTimeoutParkMs !== undefined ? { renderTimeoutParkMs: options.renderTimeoutParkMs } : {}),
    ...(watches ? { objectCache: watches } : {}),
    ...(options.seedReads ? { seedReads: options.seedReads } : {}),
    ...(options.seedReadPolicy ? { seedReadPolicy: options.seedReadPolicy } : {}),
    ...(options.warnMissingGate ? { warnMissingGate: true } : {}),
    ...(options.provisioningNotReportedAfterMs !== undefined
      ? { provisioningNotReportedAfterMs: options.provisioningNotReportedAfterMs }
      : {}),
    ...(options.reportPlan ? { reportPlan: options.reportPlan } : {}),
    ...(options.openServedGate ? { openServedGate: options.openServedGate(api) } : {}),
    ...(options.annotateVmis ? { annotateVmis: { api, ...options.annotateVmis } } : {}),
  });
  await options.beforeStart?.(agent);
  const started = agent.start();
  if (options.waitSynced !== false) await started;
  else started.catch(() => {});
  return {
    agent,
    store,
    metrics,
    watches,
    lines,
    logger,
    stop: async () => {
      await agent.stop(2000);
      await connection.close();
    },
  };
}

export async function tempDir(prefix = 'vmseed-agent-'): Promise<{ path: string; remove(): Promise<void> }> {
  const path = await mkdtemp(join(tmpdir(), prefix));
  // Retried: an agent stopped by a later `after` hook may still be writing
  // into the directory when this one runs (ENOTEMPTY under load).
  return { path, remove: () => rm(path, { recursive: true, force: true, maxRetries: 20, retryDelay: 50 }) };
}

export async function waitFor<T>(
  what: string,
  fn: () => T | undefined | false | Promise<T | undefined | false>,
  // Generous: only a failing wait runs this long, and the CI runs two test
  // files at once beside QEMU guests on two cores.
  timeoutMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function vmi(
  name: string,
  options: { namespace?: string; node?: string; userData?: string; cloudInit?: string; phase?: string } = {},
): VmiObject {
  const node = options.node ?? NODE;
  const cloudInit =
    options.cloudInit ??
    `userData: |\n  #cloud-config\n  hostname: ${name}\n${options.userData ? `  # ${options.userData}\n` : ''}`;
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name,
      namespace: options.namespace ?? 'default',
      labels: { 'kubevirt.io/nodeName': node },
      annotations: { 'vmseed.io/cloud-init': cloudInit },
    },
    spec: { domain: {} },
    status: { nodeName: node, phase: options.phase ?? 'Scheduled' },
  };
}

// A fake API server and a temporary state directory, both gone after the test.
export async function fakeKubeAndDir(t: {
  after(fn: () => Promise<void>): void;
}): Promise<{ fake: FakeKube; dir: { path: string; remove(): Promise<void> } }> {
  const fake = await FakeKube.start();
  const dir = await tempDir();
  t.after(async () => {
    await fake.close();
    await dir.remove();
  });
  return { fake, dir };
}
