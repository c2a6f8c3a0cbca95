// `vmseed agent`: the DaemonSet process (cluster mode) or the embedded
// default on a directory of manifests (`--local DIR`).
import { mkdir, stat } from 'node:fs/promises';
import { pino, type Logger } from 'pino';
import { renderSeed } from '../../cloudinit/render.ts';
import { sysfsNumaReader } from '../../libvirt/host-numa.ts';
import { ConfigError, loadConfig, configSummary, AGENT_USAGE, type Config } from '../../config/config.ts';
import { buildSeedImage } from '../../disk/seed-image.ts';
import { ImageStore } from '../../disk/store.ts';
import { asVmseedError, VmseedError } from '../../errors.ts';
import { LibvirtInjector, type ResumeHook } from '../../libvirt/injector.ts';
import { RpcLibvirtClient } from '../../libvirt/rpc/rpc-client.ts';
import { DomainLock } from '../../libvirt/domain-lock.ts';
import { DirPublisher } from '../../libvirt/publish.ts';
import type { ProcessSpawner } from '../../libvirt/virsh/runner.ts';
import { createMetrics, type Metrics } from '../../metrics/metrics.ts';
import { startHttpServer } from '../../http/status-server.ts';
import { Agent, type AgentOptions } from '../../agent/controller.ts';
import { aborted, CANCEL_GRACE_MS, ShutdownDeadline } from '../../agent/shutdown.ts';
import { clientDomainEvents, type DomainEvents } from '../../agent/domain/waits.ts';
import { LogEventRecorder, type EventRecorder } from '../../agent/events.ts';
import { prepareNocloudHttp } from './datasource.ts';
import { launcherAddresses, startLauncherFileWriter } from './launcher-addresses.ts';
import { progressReportPlanner } from '../../agent/provisioning/report-plan.ts';
import { lockStateDir, type StateLock } from './state-lock.ts';
import { freeSpaceCheck, libvirtSocketCheck, virshCheck } from './readiness-checks.ts';
import { RenderPool } from '../../agent/render-pool.ts';
import { schemaSetup, type SchemaSetup } from '../../agent/schema-status.ts';
import { SchemaWarmup } from '../../agent/schema-warmup.ts';
import { warmUpSteps } from '../../cloudinit/schema/check.ts';
import { seedGateHook, storeGateRecord } from '../../agent/domain/seed-gate.ts';
import { cancellableSpawner } from '../../libvirt/virsh/cancellable-spawner.ts';
import { NodeProcessSpawner } from '../../libvirt/virsh/runner.ts';
import type { RenderSeed } from '../../agent/deps.ts';
import { RedirectStatusPoller } from '../../redirect/status-poller.ts';
import type { KubeApi } from '../../kube/api-client.ts';
import type { KubeConnection } from '../../kube/connection.ts';
import type { CliContext, Command, ExitCode } from '../cli.ts';
import { VERSION } from '../../core/version.ts';

// What closing waits for the injector's last file work (an older seed's copy
// removed after an attach); a copy left behind goes with the next seed's
// prune, the eject, or the launcher pod's volume.
const INJECTOR_IDLE_MS = 1000;
// After the stop deadline (--shutdown-timeout), what cancelling the work
// still in flight, the injector's last file work, flushing Events (2 s at
// most) and closing the listeners and the API connection may add before
// the command returns regardless.
const CLOSE_GRACE_MS = CANCEL_GRACE_MS + INJECTOR_IDLE_MS + 3000;

/**
 * The RPC client's longest wait (ms) before retrying a missing libvirt socket.
 * A launcher's socket appears some time after its pod, and its domain is defined
 * and started soon after: the agent must be connected and subscribed before the
 * start, and a refused unix connect costs microseconds.
 */
export const CONNECT_BACKOFF_MAX_MS = 500;

// The RPC client's connections on the status page (a virsh client keeps none).
function showLibvirt(agent: Agent, injector: LibvirtInjector | undefined): void {
  const client = injector?.client;
  if (client?.stats) agent.status.setLibvirtSource(() => client.stats!());
}

/**
 * The libvirt injector the flags ask for, or undefined with `--libvirt off`.
 * `resume`: the seed gate's hook (KubeVirt's unpause in cluster mode); undefined
 * keeps libvirt's resume. `spawner`: tests run virsh fakes. The caller closes
 * `injector.client` (the RPC client's sockets).
 */
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
  // One turn per domain for the injector and the client it drives.
  const lock = new DomainLock();
  return new LibvirtInjector({
    lock,
    ...(config.libvirt.mode === 'rpc'
      ? {
          client: new RpcLibvirtClient({
            timeoutMs: config.libvirt.virshTimeoutMs,
            backoffMaxMs: CONNECT_BACKOFF_MAX_MS,
            lock,
            ...(cancel ? { cancel } : {}),
          }),
        }
      : {}),
    virshPath: config.libvirt.virshPath,
    uriTemplate: config.libvirt.uri,
    domainTemplate: config.libvirt.domainName,
    imagePathTemplate: config.libvirt.imagePathInDomain,
    ...(config.libvirt.publishDir !== undefined ? { publisher: DirPublisher.forDir(config.libvirt.publishDir) } : {}),
    resume: seedGateHook(config.libvirt.platform, resume),
    ...(spawner ? { spawner } : {}),
    bus: config.libvirt.diskBus,
    // KubeVirt owns the domain's definition; a disk in its persistent
    // config is what its launcher's sync would detach.
    liveOnly: kubevirt,
    timeoutMs: config.libvirt.virshTimeoutMs,
  });
}

/**
 * Domain events for DomainWaits, with the RPC client only: plain libvirt's one
 * URI is watched all the time, KubeVirt's launcher sockets while a VMI waits for
 * its domain.
 */
export function domainEventsFor(config: Config, injector: LibvirtInjector | undefined): DomainEvents | undefined {
  if (!injector?.client.supportsEvents) return undefined;
  const fixed = !config.libvirt.uri.includes('{');
  return clientDomainEvents(injector.client, (t) => injector.locate(t), fixed ? [config.libvirt.uri] : []);
}

// What the agent of either mode is made of: the options from the flags,
// the render pool, the stop deadline and the virsh spawner that follows it.
interface AgentParts {
  options: Omit<AgentOptions, 'events' | 'makeSource' | 'refs'>;
  store: ImageStore;
  pool: RenderPool;
  shutdown: ShutdownDeadline;
  spawner: ProcessSpawner;
  nocloudHttp: Awaited<ReturnType<typeof prepareNocloudHttp>> | undefined;
  // cloud-init's schemas as found at start (the status page's line).
  schemas: SchemaSetup;
  // Defers the first check of a release until the agent is idle.
  warmup: SchemaWarmup;
}

// A mode's agent and what closing it takes (besides the pool and the datasource).
interface ModeAgent {
  agent: Agent;
  injector: LibvirtInjector | undefined;
  close(): Promise<void>;
}

/**
 * The agent of the configured mode, and close() for what it opened. Each mode
 * loads only its own modules (the Kubernetes client is heavy).
 */
export async function makeAgent(
  config: Config,
  logger: Logger,
  metrics: Metrics,
): Promise<{ agent: Agent; close(): Promise<void> }> {
  const parts = await agentParts(config, logger, metrics);
  const made = config.mode === 'local' ? await localAgent(config, logger, parts) : await clusterAgent(config, parts);
  showLibvirt(made.agent, made.injector);
  // Said once the mode's agent exists: a start that fails (a kubeconfig
  // that cannot be loaded) says only why.
  showSchemas(parts.schemas, config, logger, metrics);
  made.agent.status.setCloudInitSchemas(parts.schemas.line);
  parts.warmup.bind({ idle: () => made.agent.queue.idle(), requeue: (key) => made.agent.queue.add(key) });
  return withDatasource(made, parts);
}

async function agentParts(config: Config, logger: Logger, metrics: Metrics): Promise<AgentParts> {
  const store = new ImageStore({ root: config.stateDir });
  const nocloudHttp = config.datasource ? await prepareNocloudHttp(config.datasource, logger, metrics) : undefined;
  // Large documents are parsed, merged and serialised on a worker thread.
  const pool = new RenderPool();
  // Armed by agent.stop() with the --shutdown-timeout deadline: each
  // reconcile's steps get a signal that follows it (render steps on the
  // worker end); the clients made for reconciles listen to it too (virsh
  // children, libvirt RPC and API calls end), and their reconciles fail
  // with CANCELLED.
  const shutdown = new ShutdownDeadline();
  const spawner = cancellableSpawner(new NodeProcessSpawner(), shutdown.reconciles);
  const schemas = schemaSetup(config.cloudInitSchemas, config.cloudInitVersion);
  const warmup = new SchemaWarmup({
    steps: (release) => warmUpSteps(config.cloudInitSchemas, release),
    onError: (release, e) =>
      logger.warn({ release, reason: e instanceof Error ? e.message : String(e) }, 'cloud-init schema warm-up failed'),
  });
  const options = {
    version: VERSION,
    nodeName: config.nodeName,
    stateDir: config.stateDir,
    config: configSummary(config),
    render: ((vmi, refs, options, context) =>
      renderSeed(vmi, refs, { ...options, offload: pool }, context)) satisfies RenderSeed,
    shutdown,
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
      schemaCheck: {
        dir: config.cloudInitSchemas,
        release: schemas.release,
        warn: (fields: Record<string, unknown>, message: string) => logger.warn(fields, message),
        deferCold: warmup.defer,
      },
    },
    resyncPeriodMs: config.resyncPeriodMs,
    fsync: config.fsync,
    ...(nocloudHttp ? { nocloudHttp: nocloudHttp.agentOptions } : {}),
    reportOtherNodes: config.mode === 'local',
    // The container's /sys is the host's (read-only): numa_node and cpulist as KubeVirt reads them.
    hostNuma: sysfsNumaReader(),
    reportPlan: progressReportPlanner({
      enabled: config.reportProgress,
      ...(nocloudHttp && config.datasource
        ? { datasource: { keyring: nocloudHttp.keyring, baseUrl: config.datasource.baseUrl } }
        : {}),
    }),
  };
  return { options, store, pool, shutdown, spawner, nocloudHttp, schemas, warmup };
}

// cloud-init's schemas under --cloud-init-schemas: one log line and one
// vmseed_cloud_init_schema_info series per release; seeds are checked
// against --cloud-init-version only when its schemas are ready.
function showSchemas(setup: SchemaSetup, config: Config, logger: Logger, metrics: Metrics): void {
  for (const s of setup.statuses) {
    metrics.cloudInitSchemaInfo.set({ release: s.release, state: s.state }, 1);
    if (s.state === 'ready')
      logger.info({ release: s.release, version: s.version, dir: config.cloudInitSchemas }, 'cloud-init schemas ready');
    else logger.warn({ release: s.release, dir: config.cloudInitSchemas, reason: s.reason }, 'cloud-init schemas off');
  }
  if (setup.release === 'off')
    logger.warn({ reason: setup.reason }, 'seeds are not checked against cloud-init schemas');
  else logger.info({ release: setup.release }, 'seeds are checked against cloud-init schemas');
}

// The injector and libvirt's domain events, as the agent's options.
function libvirtParts(config: Config, parts: AgentParts, resume?: ResumeHook) {
  // virsh children die with the stop deadline (the RPC client's calls too).
  const virsh = config.libvirt.mode === 'virsh' ? parts.spawner : undefined;
  const injector = makeInjector(config, resume, virsh, parts.shutdown.reconciles);
  const domainEvents = domainEventsFor(config, injector);
  return {
    injector,
    options: {
      ...(injector ? { injector, seedReads: injector.client } : {}),
      ...(domainEvents ? { domainEvents } : {}),
    },
  };
}

async function localAgent(config: Config, logger: Logger, parts: AgentParts): Promise<ModeAgent> {
  const { injector, options } = libvirtParts(config, parts);
  const { LocalDirSource } = await import('../../agent/local/local-vmi-source.ts');
  const events: EventRecorder = new LogEventRecorder(logger.child({ component: 'events' }));
  const agent = new Agent({
    ...parts.options,
    ...options,
    events,
    makeSource: (onKey) =>
      new LocalDirSource({ dir: config.localDir!, logger: logger.child({ component: 'local-source' }), onKey }),
    refs: (source) => source as InstanceType<typeof LocalDirSource>,
  });
  return {
    agent,
    injector,
    close: () => closeInjector(injector),
  };
}

async function clusterAgent(config: Config, parts: AgentParts): Promise<ModeAgent> {
  const [
    { KubeEventRecorder },
    { KubeConnectionApi },
    { loadConnection, KubeConnection },
    { KubeRefResolver },
    { KubeVmiSource },
    { ObjectWatches },
    { BoundedWatch },
    { NodePodWatch },
    { objectServiceApi },
  ] = await Promise.all([
    import('../../agent/events.ts'),
    import('../../kube/api-client.ts'),
    import('../../kube/connection.ts'),
    import('../../kube/resolver.ts'),
    import('../../kube/kube-vmi-source.ts'),
    import('../../kube/object-watches.ts'),
    import('../../kube/watch.ts'),
    import('../../kube/node-pods.ts'),
    import('../../kube/object-service-api.ts'),
  ]);
  const { logger, metrics } = parts.options;
  const connection = await loadConnection(config.kubeconfig, config.context ? { context: config.context } : {});
  const api = new KubeConnectionApi(connection);
  // Reconciles' reads (Secrets, ConfigMaps) and unpause end at the stop
  // deadline; Events and the informer keep their own client (the agent
  // flushes Events after the deadline).
  const reconcileApi = new KubeConnectionApi(connection, { cancel: parts.shutdown.reconciles });
  // --objects-url: Secrets and ConfigMaps come from the cluster component's
  // node-scoped service (same client, another server and credential), and
  // the seed gate's unpause goes through it, so this node's own credential
  // needs no access to them.
  const objectsConnection = config.objects ? objectsConnectionFor(config.objects, KubeConnection) : connection;
  const objectsApi =
    objectsConnection === connection || !config.objects
      ? reconcileApi
      : objectServiceApi(
          new KubeConnectionApi(objectsConnection, { cancel: parts.shutdown.reconciles }),
          config.objects.url,
        );
  const { injector, options } = libvirtParts(config, parts, await kubevirtResume(config, parts, objectsApi));
  const namespaces = config.namespaces ? { namespaces: config.namespaces } : {};
  // KubeVirt's launcher pods: the datasource answers a VMI only from its
  // launcher pod's address. --platform libvirt has none.
  const nodePods =
    parts.nocloudHttp && config.libvirt.platform === 'kubevirt'
      ? new NodePodWatch({
          api,
          watcher: new BoundedWatch({ connection }),
          nodeName: config.nodeName,
          logger: logger.child({ component: 'pod-watch' }),
          ...namespaces,
        })
      : undefined;
  nodePods?.start();
  const agent = new Agent({
    ...parts.options,
    ...options,
    // Beside KubeVirt with libvirt on. With the webhook too: a VMI it did
    // not gate was created while no agent answered (failurePolicy Ignore).
    ...(config.libvirt.platform === 'kubevirt' && config.libvirt.mode !== 'off' ? { warnMissingGate: true } : {}),
    ...(await kubevirtServedGate(config, objectsApi)),
    ...(config.provisioningAnnotation ? { annotateVmis: { api } } : {}),
    ...(nodePods ? { nodePods } : {}),
    events: new KubeEventRecorder({ api, logger: logger.child({ component: 'events' }), host: config.nodeName }),
    makeSource: (onKey) =>
      new KubeVmiSource({
        connection,
        api,
        nodeName: config.nodeName,
        logger: logger.child({ component: 'informer' }),
        ...(metrics ? { metrics } : {}),
        onKey,
        ...namespaces,
      }),
    refs: new KubeRefResolver(objectsApi, namespaces),
    objectCache: new ObjectWatches({
      api: objectsApi,
      watcher: new BoundedWatch({ connection: objectsConnection }),
      logger: logger.child({ component: 'object-watches' }),
      ...namespaces,
      ...(metrics ? { onWatchCount: (n: number) => metrics.objectWatches.set(n) } : {}),
    }),
  });
  return {
    agent,
    injector,
    close: async () => {
      await nodePods?.stop();
      await closeInjector(injector);
      await connection.close();
      if (objectsConnection !== connection) await objectsConnection.close();
    },
  };
}

// The object service's connection: its URL, the CA of its certificate (a
// file re-read as the cluster component publishes or renews it; else the
// system's), and the projected token, re-read as the kubelet rotates it.
function objectsConnectionFor(
  objects: NonNullable<Config['objects']>,
  Connection: typeof KubeConnection,
): KubeConnection {
  return new Connection({
    server: objects.url,
    tokenFile: objects.tokenFile,
    ...(objects.caFile ? { caFile: objects.caFile } : {}),
  });
}

// Its last file work (bounded), then the RPC client's sockets.
async function closeInjector(injector: LibvirtInjector | undefined): Promise<void> {
  await injector?.idle(INJECTOR_IDLE_MS);
  await injector?.client.close();
}

// --resume-via kubevirt: the seed gate's "unpaused" is kept next to the
// VMI's images, so a restart does not unpause a VMI its owner paused since.
async function kubevirtResume(config: Config, parts: AgentParts, api: KubeApi): Promise<ResumeHook | undefined> {
  if (config.libvirt.resumeVia !== 'kubevirt') return undefined;
  const { kubevirtUnpause } = await import('../../agent/domain/kubevirt-resume.ts');
  return kubevirtUnpause(api, storeGateRecord(parts.store, { fsync: config.fsync }));
}

// The same for VMIs served over HTTP only: unpaused once their seed is
// served. Their "unpaused" is kept in memory: such a VMI has no directory in
// the state store that its deletion would clean up.
async function kubevirtServedGate(config: Config, api: KubeApi): Promise<Pick<AgentOptions, 'openServedGate'>> {
  if (config.libvirt.resumeVia !== 'kubevirt') return {};
  const resume = await import('../../agent/domain/kubevirt-resume.ts');
  return { openServedGate: resume.kubevirtServedGate(api) };
}

// The datasource listener serves the agent's seeds; stopped after the agent.
async function withDatasource(made: ModeAgent, parts: AgentParts): Promise<{ agent: Agent; close(): Promise<void> }> {
  const close = async () => {
    parts.warmup.stop();
    await parts.pool.close();
    await made.close();
  };
  let ds;
  try {
    ds = parts.nocloudHttp ? await parts.nocloudHttp.start(made.agent) : undefined;
  } catch (e) {
    await close();
    throw e;
  }
  return {
    agent: made.agent,
    close: async () => {
      await ds?.close();
      await close();
    },
  };
}

/**
 * `vmseed agent`: runs until SIGTERM/SIGINT, then stops within
 * --shutdown-timeout. Exit 0 when everything finished in time, 2 on a flag
 * error, 1 otherwise (failed to start, work cancelled or abandoned).
 */
export const agent: Command = async (ctx) => {
  const config = readConfig(ctx);
  if (typeof config === 'number') return config;
  const missing = await localDirProblem(config);
  if (missing) {
    ctx.stderr.write(`vmseed agent: ${missing}\n`);
    return 2;
  }
  const logger = pino({ level: config.logLevel, base: { node: config.nodeName } }, ctx.stderr);
  const metrics = createMetrics({ version: VERSION });
  const made = await startAgent(ctx, config, logger, metrics);
  if (typeof made === 'number') return made;
  addReadinessChecks(made.agent, config, ctx.env);
  const redirectPoller = config.redirectStatusUrl
    ? new RedirectStatusPoller({ url: config.redirectStatusUrl })
    : undefined;
  if (redirectPoller) made.agent.status.setRedirectSource(() => redirectPoller.status);
  if (config.launcherAddressesFile !== undefined) {
    const writer = startLauncherFileWriter(config.launcherAddressesFile, launcherAddresses(made.agent), logger);
    // The file stays after a stop: the redirect keeps the VMs it has.
    ctx.stopSignal.addEventListener('abort', () => void writer.close(), { once: true });
  }
  let http: Listeners;
  try {
    http = await listen(config, made.agent, metrics, logger);
  } catch (e) {
    ctx.stderr.write(`vmseed agent: ${(e as Error).message}\n`);
    await made.close();
    return 1;
  }
  const log = logger.child({ component: 'agent' });
  const failed = await runUntilStopped(ctx, config, made.agent, redirectPoller, http, log);
  return stop(config, made, redirectPoller, http, log, failed);
};

// --local DIR that is not a readable directory: said before any listener
// opens or the state directory is touched, as a flag error.
async function localDirProblem(config: Config): Promise<string | undefined> {
  if (config.mode !== 'local' || config.localDir === undefined) return undefined;
  try {
    if ((await stat(config.localDir)).isDirectory()) return undefined;
    return `--local ${config.localDir}: not a directory; give the directory of YAML manifests to run on`;
  } catch (e) {
    return `--local ${config.localDir}: ${(e as NodeJS.ErrnoException).code ?? 'cannot read it'}; give an existing directory of YAML manifests`;
  }
}

// The configuration, or the exit code (usage, or a flag error).
function readConfig(ctx: CliContext): Config | ExitCode {
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
  return config;
}

// The agent with its state directory locked, or the exit code. close()
// releases the lock last: nothing of this agent touches the directory after.
async function startAgent(
  ctx: CliContext,
  config: Config,
  logger: Logger,
  metrics: Metrics,
): Promise<{ agent: Agent; close(): Promise<void> } | ExitCode> {
  let lock: StateLock | undefined;
  try {
    await mkdir(config.stateDir, { recursive: true, mode: 0o750 });
    // Before anything reads or deletes in the state directory (GC).
    lock = await lockStateDir(config.stateDir);
    const made = await makeAgent(config, logger, metrics);
    const held = lock;
    return {
      agent: made.agent,
      close: async () => {
        await made.close();
        await held.release();
      },
    };
  } catch (e) {
    await lock?.release();
    const err = asVmseedError(e);
    ctx.stderr.write(`vmseed agent: ${err.code === 'INTERNAL' ? (e as Error).message : err.message}\n`);
    return err.code === 'CONFIG_INVALID' || err.code === 'DATASOURCE_KEY_INVALID' ? 2 : 1;
  }
}

function addReadinessChecks(agent: Agent, config: Config, env: NodeJS.ProcessEnv): void {
  if (config.libvirt.mode === 'virsh') agent.status.addReadinessCheck(virshCheck(config.libvirt.virshPath, env.PATH));
  const socketCheck = config.libvirt.mode === 'off' ? undefined : libvirtSocketCheck(config.libvirt.uri);
  if (socketCheck) agent.status.addReadinessCheck(socketCheck);
  // Room for the largest seed the limits allow (user-data and vendor-data,
  // network-config, and the ISO's own structures).
  agent.status.addReadinessCheck(
    freeSpaceCheck(config.stateDir, 2 * config.maxUserDataBytes + config.maxNetworkDataBytes + 1024 * 1024),
  );
}

interface Listeners {
  url: string;
  statusUrl: string;
  close(): Promise<void>;
}

const hostPort = (a: { host: string; port: number }) =>
  a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;

// Two listeners unless both flags name one address: probes and /metrics
// for the pod network, the per-VMI detail for whoever reaches statusListen.
// Throws (with the flag named) after closing what it opened.
async function listen(config: Config, agent: Agent, metrics: Metrics, logger: Logger): Promise<Listeners> {
  const listen = hostPort(config.listen);
  const statusListen = hostPort(config.statusListen);
  const split = listen !== statusListen;
  const servers: Array<Awaited<ReturnType<typeof startHttpServer>>> = [];
  try {
    for (const [addr, serve] of split
      ? ([
          [listen, 'probes'],
          [statusListen, 'status'],
        ] as const)
      : ([[listen, 'all']] as const)) {
      servers.push(
        await startHttpServer({ listen: addr, serve, metrics, status: agent.status, logger }).catch((e: Error) => {
          // The server's own message names --listen; say it once, for the
          // flag this listener comes from.
          const flag = serve === 'status' ? '--status-listen' : '--listen';
          const why = (e.cause as NodeJS.ErrnoException | undefined)?.code ?? e.message;
          throw new Error(`cannot listen on ${addr} (${flag}): ${why}; choose another ${flag} address`);
        }),
      );
    }
  } catch (e) {
    await Promise.all(servers.map((s) => s.close()));
    throw e;
  }
  agent.status.setConfig({
    listen: hostPort(servers[0].address),
    statusListen: hostPort(servers.at(-1)!.address),
  });
  return {
    url: servers[0].url,
    statusUrl: servers.at(-1)!.url,
    close: async () => {
      await Promise.all(servers.map((s) => s.close()));
    },
  };
}

// Runs the agent until the stop signal; true when it failed to start.
async function runUntilStopped(
  ctx: CliContext,
  config: Config,
  agent: Agent,
  redirectPoller: RedirectStatusPoller | undefined,
  http: Listeners,
  log: Logger,
): Promise<boolean> {
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
  const started = agent.start().then(
    () => log.info({ vmis: agent.source.keys().length }, 'agent running'),
    (e: unknown) => {
      log.error({ err: { message: (e as Error).message } }, 'agent failed to start');
      throw e;
    },
  );
  let failed = false;
  await Promise.race([stopped, started.catch(() => (failed = true))]);
  if (!failed) await stopped;
  return failed;
}

// Stops within the deadline and says how it went; the exit code.
async function stop(
  config: Config,
  made: { agent: Agent; close(): Promise<void> },
  redirectPoller: RedirectStatusPoller | undefined,
  http: Listeners,
  log: Logger,
  failed: boolean,
): Promise<ExitCode> {
  const { agent } = made;
  const deadlineMs = config.shutdownTimeoutMs;
  log.info({ deadlineMs }, 'stopping: no new work, finishing what is in flight');
  // Every step is bounded by the one deadline: a reconcile stuck in a file
  // read or a virsh call must not keep the pod past its grace period.
  // main() then ends the process even if that work still holds the event
  // loop.
  agent.shutdown.arm(deadlineMs, CLOSE_GRACE_MS);
  const shutdown = (async () => {
    const finished = await agent.stop(deadlineMs);
    await redirectPoller?.stop();
    await http.close();
    await made.close();
    return finished;
  })();
  const outcome = await Promise.race([shutdown, aborted(agent.shutdown.closed).then(() => 'timeout' as const)]);
  agent.shutdown.dispose();
  if (outcome === true) {
    log.info({ finished: true }, 'vmseed agent stopped');
    return failed ? 1 : 0;
  }
  if (outcome === false && agent.stopOutcome === 'cancelled') {
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
      inFlight: agent.queue.inFlight,
      reason:
        outcome === 'timeout'
          ? 'shutdown steps did not finish in time'
          : 'reconciles still in flight at the stop deadline',
    },
    'vmseed agent stopped with work abandoned; exiting anyway',
  );
  return 1;
}
