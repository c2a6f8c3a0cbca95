// `vmseed agent`: the DaemonSet process (cluster mode) or the embedded
// default on a directory of manifests (`--local DIR`).
import { mkdir } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { createRequire } from 'node:module';
import { pino, type Logger } from 'pino';
import { renderSeed } from '../cloudinit/render.ts';
import { sysfsNumaReader } from '../libvirt/host-numa.ts';
import { ConfigError, loadConfig, configSummary, AGENT_USAGE, type Config } from '../config.ts';
import { buildSeedImage } from '../disk/seed-image.ts';
import { ImageStore } from '../disk/store.ts';
import { asVmseedError, VmseedError } from '../errors.ts';
import { LibvirtInjector, type ResumeHook } from '../libvirt/injector.ts';
import { RpcLibvirtClient } from '../libvirt/rpc-client.ts';
import { DirPublisher } from '../libvirt/publish.ts';
import type { ProcessSpawner } from '../libvirt/virsh.ts';
import { createMetrics, type Metrics } from '../metrics/metrics.ts';
import { startHttpServer } from '../http/server.ts';
import { Agent, CANCEL_GRACE_MS } from '../agent/agent.ts';
import { clientDomainEvents, type DomainEvents } from '../agent/domain-waits.ts';
import { LogEventRecorder, type EventRecorder } from '../agent/events.ts';
import { prepareNocloudHttp } from '../agent/nocloud-http.ts';
import { lockStateDir, type StateLock } from '../agent/state-lock.ts';
import { freeSpaceCheck, libvirtSocketCheck, virshCheck } from '../agent/readiness-checks.ts';
import { RenderPool } from '../agent/render-pool.ts';
import { cancellableSpawner } from '../agent/cancellable-spawner.ts';
import { NodeProcessSpawner } from '../libvirt/virsh.ts';
import type { RenderSeed } from '../agent/deps.ts';
import { RedirectStatusPoller } from '../agent/redirect-status.ts';
import { startAdmission, type Admission } from '../agent/admission.ts';
import type { Command } from './cli.ts';

const VERSION = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;

// What closing waits for the injector's last file work (an older seed's copy
// removed after an attach); a copy left behind goes with the next seed's
// prune, the eject, or the launcher pod's volume.
const INJECTOR_IDLE_MS = 1000;
// After the stop deadline (--shutdown-timeout), what cancelling the work
// still in flight, the injector's last file work, flushing Events (2 s at
// most) and closing the listeners and the API connection may add before
// the command returns regardless.
const CLOSE_GRACE_MS = CANCEL_GRACE_MS + INJECTOR_IDLE_MS + 3000;

// The RPC client's connections on the status page (a virsh client keeps none).
function showLibvirt(agent: Agent, injector: LibvirtInjector | undefined): void {
  const client = injector?.client;
  if (client?.stats) agent.status.setLibvirtSource(() => client.stats!());
}

// `resume`: the seed gate's hook (KubeVirt's unpause in cluster mode);
// undefined keeps libvirt's resume. `spawner`: tests run virsh fakes.
// The caller closes `injector.client` (the RPC client's sockets).
export function makeInjector(
  config: Config,
  resume?: ResumeHook,
  spawner?: ProcessSpawner,
  cancel?: AbortSignal,
): LibvirtInjector | undefined {
  if (config.libvirt.mode === 'off') return undefined;
  if (spawner && config.libvirt.mode !== 'virsh')
    throw new VmseedError('INTERNAL', 'a virsh process spawner was given with --libvirt rpc', { kind: 'terminal' });
  const kubevirt = config.libvirt.platform === 'kubevirt';
  return new LibvirtInjector({
    ...(config.libvirt.mode === 'rpc'
      ? { client: new RpcLibvirtClient({ timeoutMs: config.libvirt.virshTimeoutMs, ...(cancel ? { cancel } : {}) }) }
      : {}),
    virshPath: config.libvirt.virshPath,
    uriTemplate: config.libvirt.uri,
    domainTemplate: config.libvirt.domainName,
    imagePathTemplate: config.libvirt.imagePathInDomain,
    ...(config.libvirt.publishDir !== undefined ? { publisher: dirPublisher(config.libvirt.publishDir) } : {}),
    ...(resume ? { resume } : kubevirt ? { resume: noVirshResume } : {}),
    ...(spawner ? { spawner } : {}),
    bus: config.libvirt.diskBus,
    // KubeVirt owns the domain's definition; a disk in its persistent
    // config is what its launcher's sync would detach.
    liveOnly: kubevirt,
    timeoutMs: config.libvirt.virshTimeoutMs,
  });
}

// KubeVirt resumes any pause it did not order and keeps its own record of
// the one it made: the kubevirt platform never falls back to `virsh resume`.
const noVirshResume: ResumeHook = async () => {
  throw new VmseedError(
    'CONFIG_INVALID',
    "the seed gate on --platform kubevirt resumes through KubeVirt's unpause API only, and none is configured",
    { kind: 'terminal', field: 'resumeVia' },
  );
};

// With the RPC client: plain libvirt's one URI is watched all the time;
// KubeVirt's launcher sockets while a VMI waits for its domain.
export function domainEventsFor(config: Config, injector: LibvirtInjector | undefined): DomainEvents | undefined {
  if (!injector?.client.supportsEvents) return undefined;
  const fixed = !config.libvirt.uri.includes('{');
  return clientDomainEvents(injector.client, (t) => injector.locate(t), fixed ? [config.libvirt.uri] : []);
}

// The publish directory's last component is ours to create (e.g. `vmseed`
// in the launcher's emptyDir); its parent must exist.
function dirPublisher(template: string): DirPublisher {
  const last = basename(template);
  if (last === '' || last.includes('{') || dirname(template) === template)
    return new DirPublisher({ dirTemplate: template });
  return new DirPublisher({ dirTemplate: dirname(template), subdir: last });
}

// Each mode loads only its own modules (the Kubernetes client is heavy).
export async function makeAgent(
  config: Config,
  logger: Logger,
  metrics: Metrics,
): Promise<{ agent: Agent; close(): Promise<void> }> {
  const store = new ImageStore({ root: config.stateDir });
  const nocloudHttp = config.datasource ? await prepareNocloudHttp(config.datasource, logger, metrics) : undefined;
  // Large documents are parsed, merged and serialised on a worker thread.
  const pool = new RenderPool();
  // Aborted by agent.stop() at the --shutdown-timeout deadline: render
  // steps on the worker and virsh children end, their reconciles fail with
  // CANCELLED.
  const cancel = new AbortController();
  const spawner = cancellableSpawner(new NodeProcessSpawner(), cancel.signal);
  const common = {
    version: VERSION,
    nodeName: config.nodeName,
    stateDir: config.stateDir,
    config: configSummary(config),
    render: ((vmi, refs, options, context) =>
      renderSeed(vmi, refs, { ...options, offload: pool, signal: cancel.signal }, context)) satisfies RenderSeed,
    cancel,
    build: buildSeedImage,
    store,
    metrics,
    logger,
    concurrency: config.concurrency,
    renderOptions: {
      kubevirtVolumes: config.kubevirtVolumes,
      maxUserDataBytes: config.maxUserDataBytes,
      maxNetworkDataBytes: config.maxNetworkDataBytes,
      ...(config.vendorDataFrom ? { defaultVendorData: config.vendorDataFrom } : {}),
    },
    resyncPeriodMs: config.resyncPeriodMs,
    fsync: config.fsync,
    ...(nocloudHttp ? { nocloudHttp: nocloudHttp.agentOptions } : {}),
    reportOtherNodes: config.mode === 'local',
    // The container's /sys is the host's (read-only): numa_node and cpulist as KubeVirt reads them.
    hostNuma: sysfsNumaReader(),
  };
  // The datasource listener serves the agent's seeds; stopped after the agent.
  const withDatasource = async (agent: Agent, closeMode: () => Promise<void>) => {
    const close = async () => {
      await pool.close();
      await closeMode();
    };
    let ds;
    try {
      ds = nocloudHttp ? await nocloudHttp.start(agent) : undefined;
    } catch (e) {
      await close();
      throw e;
    }
    return {
      agent,
      close: async () => {
        await ds?.close();
        await close();
      },
    };
  };
  if (config.mode === 'local') {
    // virsh children die with the stop deadline (the RPC client's calls have their own).
    const injector = makeInjector(
      config,
      undefined,
      config.libvirt.mode === 'virsh' ? spawner : undefined,
      cancel.signal,
    );
    const domainEvents = domainEventsFor(config, injector);
    const withInjector = { ...(injector ? { injector } : {}), ...(domainEvents ? { domainEvents } : {}) };
    const { LocalDirSource } = await import('../agent/local/source.ts');
    const events: EventRecorder = new LogEventRecorder(logger.child({ component: 'events' }));
    const agent = new Agent({
      ...common,
      ...withInjector,
      events,
      makeSource: (onKey) =>
        new LocalDirSource({ dir: config.localDir!, logger: logger.child({ component: 'local-source' }), onKey }),
      refs: (source) => source as InstanceType<typeof LocalDirSource>,
    });
    showLibvirt(agent, injector);
    return withDatasource(agent, async () => {
      await injector?.idle(INJECTOR_IDLE_MS);
      await injector?.client.close();
    });
  }
  const [
    { KubeEventRecorder },
    { KubeConnectionApi },
    { loadConnection },
    { KubeRefResolver },
    { KubeVmiSource },
    { kubevirtUnpause, storeGateRecord },
  ] = await Promise.all([
    import('../agent/events.ts'),
    import('../kube/api.ts'),
    import('../kube/connection.ts'),
    import('../kube/resolver.ts'),
    import('../kube/source.ts'),
    import('../agent/kubevirt-resume.ts'),
  ]);
  const connection = loadConnection(config.kubeconfig);
  const api = new KubeConnectionApi(connection);
  // The seed gate's "unpaused" is kept next to the VMI's images: a restart
  // must not unpause a VMI its owner paused since.
  // Reconciles' reads (Secrets, ConfigMaps) and unpause end at the stop
  // deadline; Events and the informer keep their own client (the agent
  // flushes Events after the deadline).
  const reconcileApi = new KubeConnectionApi(connection, { cancel: cancel.signal });
  const injector = makeInjector(
    config,
    config.libvirt.resumeVia === 'kubevirt'
      ? kubevirtUnpause(reconcileApi, storeGateRecord(store, { fsync: config.fsync }))
      : undefined,
    config.libvirt.mode === 'virsh' ? spawner : undefined,
    cancel.signal,
  );
  const domainEvents = domainEventsFor(config, injector);
  const withInjector = { ...(injector ? { injector } : {}), ...(domainEvents ? { domainEvents } : {}) };
  const agent = new Agent({
    ...common,
    ...withInjector,
    events: new KubeEventRecorder({ api, logger: logger.child({ component: 'events' }), host: config.nodeName }),
    makeSource: (onKey) =>
      new KubeVmiSource({
        connection,
        api,
        nodeName: config.nodeName,
        logger: logger.child({ component: 'informer' }),
        metrics,
        onKey,
        ...(config.namespaces ? { namespaces: config.namespaces } : {}),
      }),
    refs: new KubeRefResolver(reconcileApi, config.namespaces ? { namespaces: config.namespaces } : {}),
  });
  showLibvirt(agent, injector);
  return withDatasource(agent, async () => {
    await injector?.idle(INJECTOR_IDLE_MS);
    await injector?.client.close();
    await connection.close();
  });
}

export const agent: Command = async (ctx) => {
  let config: Config | undefined;
  try {
    config = loadConfig(ctx.argv, ctx.env, ctx.cwd);
  } catch (e) {
    if (e instanceof ConfigError) {
      ctx.stderr.write(`vmseed agent: ${e.message}\n`);
      return 2;
    }
    throw e;
  }
  if (!config) {
    ctx.stdout.write(AGENT_USAGE);
    return 0;
  }
  const logger = pino({ level: config.logLevel, base: { node: config.nodeName } }, ctx.stderr);
  const log = logger.child({ component: 'agent' });
  const metrics = createMetrics({ version: VERSION });
  let agentInstance: Agent;
  let closeAgent: () => Promise<void>;
  let lock: StateLock | undefined;
  try {
    await mkdir(config.stateDir, { recursive: true, mode: 0o750 });
    // Before anything reads or deletes in the state directory (GC).
    lock = await lockStateDir(config.stateDir);
    const made = await makeAgent(config, logger, metrics);
    agentInstance = made.agent;
    closeAgent = () => made.close();
  } catch (e) {
    await lock?.release();
    const err = asVmseedError(e);
    ctx.stderr.write(`vmseed agent: ${err.code === 'INTERNAL' ? (e as Error).message : err.message}\n`);
    return err.code === 'CONFIG_INVALID' || err.code === 'DATASOURCE_KEY_INVALID' ? 2 : 1;
  }
  if (config.libvirt.mode === 'virsh')
    agentInstance.status.addReadinessCheck(virshCheck(config.libvirt.virshPath, ctx.env.PATH));
  const socketCheck = config.libvirt.mode === 'off' ? undefined : libvirtSocketCheck(config.libvirt.uri);
  if (socketCheck) agentInstance.status.addReadinessCheck(socketCheck);
  // Room for the largest seed the limits allow (user-data and vendor-data,
  // network-config, and the ISO's own structures).
  agentInstance.status.addReadinessCheck(
    freeSpaceCheck(config.stateDir, 2 * config.maxUserDataBytes + config.maxNetworkDataBytes + 1024 * 1024),
  );
  // The lock goes last: nothing of this agent touches the directory after.
  const closeConnection = async () => {
    await closeAgent();
    await lock.release();
  };
  const redirectPoller = config.redirectStatusUrl
    ? new RedirectStatusPoller({ url: config.redirectStatusUrl })
    : undefined;
  if (redirectPoller) agentInstance.status.setRedirectSource(() => redirectPoller.status);
  const hostPort = (a: { host: string; port: number }) =>
    a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
  const listen = hostPort(config.listen);
  const statusListen = hostPort(config.statusListen);
  // Two listeners unless both flags name one address: probes and /metrics
  // for the pod network, the per-VMI detail for whoever reaches statusListen.
  const split = listen !== statusListen;
  const servers: Array<Awaited<ReturnType<typeof startHttpServer>>> = [];
  let admission: Admission | undefined;
  try {
    for (const [addr, serve] of split
      ? ([
          [listen, 'probes'],
          [statusListen, 'status'],
        ] as const)
      : ([[listen, 'all']] as const)) {
      servers.push(
        await startHttpServer({ listen: addr, serve, metrics, status: agentInstance.status, logger }).catch(
          (e: Error) => {
            throw new Error(
              `cannot listen on ${addr} (${serve === 'status' ? '--status-listen' : '--listen'}): ${e.message}`,
            );
          },
        ),
      );
    }
    if (config.webhook) admission = await startAdmission(config.webhook, config.datasource, logger);
  } catch (e) {
    ctx.stderr.write(`vmseed agent: ${(e as Error).message}\n`);
    await Promise.all(servers.map((s) => s.close()));
    await closeConnection();
    return 1;
  }
  if (admission) agentInstance.status.addReadinessCheck(admission.readiness);
  const http = {
    url: servers[0].url,
    statusUrl: servers.at(-1)!.url,
    close: async () => void (await Promise.all(servers.map((s) => s.close()))),
  };
  agentInstance.status.setConfig({
    listen: hostPort(servers[0].address),
    statusListen: hostPort(servers.at(-1)!.address),
  });
  log.info(
    {
      mode: config.mode,
      stateDir: config.stateDir,
      url: http.url,
      statusUrl: http.statusUrl,
      libvirt: config.libvirt.mode,
      version: VERSION,
    },
    'vmseed agent starting',
  );

  const stopped = new Promise<void>((resolve) => {
    if (ctx.stopSignal.aborted) resolve();
    ctx.stopSignal.addEventListener('abort', () => resolve(), { once: true });
  });
  redirectPoller?.start();
  const started = agentInstance.start().then(
    () => log.info({ vmis: agentInstance.source.keys().length }, 'agent running'),
    (e: unknown) => {
      log.error({ err: { message: (e as Error).message } }, 'agent failed to start');
      throw e;
    },
  );
  let failed = false;
  await Promise.race([stopped, started.catch(() => (failed = true))]);
  if (!failed) await stopped;
  const deadlineMs = config.shutdownTimeoutMs;
  log.info({ deadlineMs }, 'stopping: no new work, finishing what is in flight');
  // Every step is bounded: a reconcile stuck in a file read or a virsh call
  // must not keep the pod past its grace period. main() then ends the
  // process even if that work still holds the event loop.
  const shutdown = (async () => {
    const finished = await agentInstance.stop(deadlineMs);
    await redirectPoller?.stop();
    await admission?.close();
    await http.close();
    await closeConnection();
    return finished;
  })();
  let timer: NodeJS.Timeout | undefined;
  const outcome = await Promise.race([
    shutdown,
    new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), deadlineMs + CLOSE_GRACE_MS))),
  ]);
  clearTimeout(timer);
  if (outcome === true) {
    log.info({ finished: true }, 'vmseed agent stopped');
    return failed ? 1 : 0;
  }
  if (outcome === false && agentInstance.stopOutcome === 'cancelled') {
    log.warn(
      { finished: false, deadlineMs, reason: 'reconciles still in flight at the stop deadline were cancelled' },
      'vmseed agent stopped; cancelled work runs again at the next start',
    );
    return 1;
  }
  log.warn(
    {
      finished: false,
      deadlineMs,
      inFlight: agentInstance.queue.inFlight,
      reason:
        outcome === 'timeout'
          ? 'shutdown steps did not finish in time'
          : 'reconciles still in flight at the stop deadline',
    },
    'vmseed agent stopped with work abandoned; exiting anyway',
  );
  return 1;
};
