// `vmseed agent`: the DaemonSet process (cluster mode) or the embedded
// default on a directory of manifests (`--local DIR`).
import { mkdir } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { pino, type Logger } from 'pino';
import { renderSeed } from '../cloudinit/render.ts';
import { ConfigError, loadConfig, configSummary, AGENT_USAGE, type Config } from '../config.ts';
import { buildSeedImage } from '../disk/seed-image.ts';
import { ImageStore } from '../disk/store.ts';
import { asVmseedError } from '../errors.ts';
import { VirshInjector, type ResumeHook } from '../libvirt/injector.ts';
import { DirPublisher } from '../libvirt/publish.ts';
import type { ProcessSpawner } from '../libvirt/virsh.ts';
import type { Injector } from '../libvirt/types.ts';
import { createMetrics, type Metrics } from '../metrics/metrics.ts';
import { startHttpServer } from '../http/server.ts';
import { Agent } from '../agent/agent.ts';
import { LogEventRecorder, type EventRecorder } from '../agent/events.ts';
import { prepareNocloudHttp } from '../agent/nocloud-http.ts';
import type { Command } from './cli.ts';

const VERSION: string = createRequire(import.meta.url)('../../package.json').version;

// How long in-flight reconciles get after SIGTERM (the DaemonSet's
// terminationGracePeriodSeconds is 30 s by default).
const STOP_DEADLINE_MS = 20_000;

// `resume`: the seed gate's hook (KubeVirt's unpause in cluster mode);
// undefined keeps `virsh resume`. `spawner`: tests run virsh fakes.
export function makeInjector(config: Config, resume?: ResumeHook, spawner?: ProcessSpawner): Injector | undefined {
  if (config.libvirt.mode === 'off') return undefined;
  return new VirshInjector({
    virshPath: config.libvirt.virshPath,
    uriTemplate: config.libvirt.uri,
    domainTemplate: config.libvirt.domainName,
    imagePathTemplate: config.libvirt.imagePathInDomain,
    ...(config.libvirt.publishDir !== undefined ? { publisher: new DirPublisher({ dirTemplate: config.libvirt.publishDir }) } : {}),
    ...(resume ? { resume } : {}),
    ...(spawner ? { spawner } : {}),
    bus: config.libvirt.diskBus,
    timeoutMs: config.libvirt.virshTimeoutMs,
  });
}

// Each mode loads only its own modules (the Kubernetes client is heavy).
export async function makeAgent(config: Config, logger: Logger, metrics: Metrics): Promise<{ agent: Agent; close(): Promise<void> }> {
  const store = new ImageStore({ root: config.stateDir });
  const nocloudHttp = config.datasource ? await prepareNocloudHttp(config.datasource, logger, metrics) : undefined;
  const common = {
    version: VERSION,
    nodeName: config.nodeName,
    stateDir: config.stateDir,
    config: configSummary(config),
    render: renderSeed,
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
  };
  // The datasource listener serves the agent's seeds; stopped after the agent.
  const withDatasource = async (agent: Agent, close: () => Promise<void>) => {
    let ds;
    try {
      ds = nocloudHttp ? await nocloudHttp.start(agent) : undefined;
    } catch (e) {
      await close();
      throw e;
    }
    return { agent, close: async () => { await ds?.close(); await close(); } };
  };
  if (config.mode === 'local') {
    const injector = makeInjector(config);
    const withInjector = injector ? { injector } : {};
    const { LocalDirSource } = await import('../agent/local-source.ts');
    const events: EventRecorder = new LogEventRecorder(logger.child({ component: 'events' }));
    const agent = new Agent({
      ...common,
      ...withInjector,
      events,
      makeSource: (onKey) => new LocalDirSource({ dir: config.localDir!, logger: logger.child({ component: 'local-source' }), onKey }),
      refs: (source) => source as InstanceType<typeof LocalDirSource>,
    });
    return withDatasource(agent, async () => {});
  }
  const [{ KubeEventRecorder }, { KubeConnectionApi }, { loadConnection }, { KubeRefResolver }, { KubeVmiSource }, { kubevirtUnpause }] = await Promise.all([
    import('../agent/events.ts'),
    import('../agent/kube-api.ts'),
    import('../agent/kube-connection.ts'),
    import('../agent/kube-resolver.ts'),
    import('../agent/kube-source.ts'),
    import('../agent/kubevirt-resume.ts'),
  ]);
  const connection = loadConnection(config.kubeconfig);
  const api = new KubeConnectionApi(connection);
  const injector = makeInjector(config, config.libvirt.resumeVia === 'kubevirt' ? kubevirtUnpause(api) : undefined);
  const withInjector = injector ? { injector } : {};
  const agent = new Agent({
    ...common,
    ...withInjector,
    events: new KubeEventRecorder({ api, logger: logger.child({ component: 'events' }), host: config.nodeName }),
    makeSource: (onKey) =>
      new KubeVmiSource({ connection, api, nodeName: config.nodeName, logger: logger.child({ component: 'informer' }), metrics, onKey, ...(config.namespaces ? { namespaces: config.namespaces } : {}) }),
    refs: new KubeRefResolver(api, config.namespaces ? { namespaces: config.namespaces } : {}),
  });
  return withDatasource(agent, () => connection.close());
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
  let closeConnection: () => Promise<void>;
  try {
    await mkdir(config.stateDir, { recursive: true, mode: 0o750 });
    ({ agent: agentInstance, close: closeConnection } = await makeAgent(config, logger, metrics));
  } catch (e) {
    const err = asVmseedError(e);
    ctx.stderr.write(`vmseed agent: ${err.code === 'INTERNAL' ? (e as Error).message : err.message}\n`);
    return err.code === 'CONFIG_INVALID' || err.code === 'DATASOURCE_KEY_INVALID' ? 2 : 1;
  }
  const listen = config.listen.host.includes(':') ? `[${config.listen.host}]:${config.listen.port}` : `${config.listen.host}:${config.listen.port}`;
  let http;
  try {
    http = await startHttpServer({ listen, metrics, status: agentInstance.status, logger }); // it names its own component
  } catch (e) {
    ctx.stderr.write(`vmseed agent: cannot listen on ${listen}: ${(e as Error).message}\n`);
    await closeConnection();
    return 1;
  }
  const bound = http.address.host.includes(':') ? `[${http.address.host}]:${http.address.port}` : `${http.address.host}:${http.address.port}`;
  agentInstance.status.setConfig({ listen: bound });
  log.info({ mode: config.mode, stateDir: config.stateDir, url: http.url, libvirt: config.libvirt.mode, version: VERSION }, 'vmseed agent starting');

  const stopped = new Promise<void>((resolve) => {
    if (ctx.stopSignal.aborted) resolve();
    ctx.stopSignal.addEventListener('abort', () => resolve(), { once: true });
  });
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
  log.info('stopping: no new work, finishing what is in flight');
  const finished = await agentInstance.stop(STOP_DEADLINE_MS);
  await http.close();
  await closeConnection();
  log.info({ finished }, 'vmseed agent stopped');
  return failed ? 1 : 0;
};
