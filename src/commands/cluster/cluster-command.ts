// `vmseed cluster`: the cluster component, run as a Deployment off the VM
// nodes: what no VM node should hold or serve, where a VM's escape would
// reach it (the admission webhook and the services SERVICES lists). Each
// service is one entry of SERVICES (its listener, its readiness, its
// close); /healthz, /readyz and /metrics are on --probe-listen.
import { pino, type Logger } from 'pino';
import { CLUSTER_USAGE, loadClusterConfig, type ClusterConfig } from '../../config/cluster-config.ts';
import { ConfigError } from '../../config/values.ts';
import { VERSION } from '../../core/version.ts';
import { startProbeServer, type ProbeServer } from '../../http/probe-server.ts';
import { createMetrics, type Metrics } from '../../metrics/metrics.ts';
import type { CliContext, Command, ExitCode } from '../cli.ts';
import type { ClusterService, StartService } from './service.ts';
import { startAdmission } from './webhook.ts';
import { startObjects } from './object-service.ts';

// The component's services: for the configuration, how to start one, or
// undefined when its flags leave it off. A service is its --<name>-listen
// flag in src/config/cluster-config.ts, its module, and one entry here.
// Started in this order, closed in the reverse.
const SERVICES: ReadonlyArray<(config: ClusterConfig) => StartService | undefined> = [
  (config) => (config.webhook.listen ? startAdmission : undefined),
  (config) => (config.objects ? startObjects : undefined),
];

const hostPort = (a: { address: string; port: number }) =>
  a.address.includes(':') ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`;

// The configuration, or the exit code (usage, or a flag error).
function readConfig(ctx: CliContext): ClusterConfig | ExitCode {
  let config: ClusterConfig | undefined;
  try {
    config = loadClusterConfig(ctx.argv, ctx.env, ctx.cwd);
  } catch (e) {
    if (e instanceof ConfigError) {
      ctx.stderr.write(`vmseed cluster: ${e.message}\nRun 'vmseed cluster --help' for its options.\n`);
      return 2;
    }
    throw e;
  }
  if (!config) {
    ctx.stdout.write(CLUSTER_USAGE);
    return 0;
  }
  return config;
}

// Every service and the probe listener, or throws after closing what it opened.
async function startAll(
  config: ClusterConfig,
  logger: Logger,
  metrics: Metrics,
): Promise<{ services: ClusterService[]; probes: ProbeServer }> {
  const services: ClusterService[] = [];
  try {
    for (const pick of SERVICES) {
      const start = pick(config);
      if (start) services.push(await start(config, logger, metrics));
    }
    const probes = await startProbeServer({
      listen: config.probeListen,
      registry: metrics.registry,
      checks: () => services.flatMap((s) => (s.readiness ? [s.readiness] : [])),
    }).catch((e: NodeJS.ErrnoException) => {
      const { host, port } = config.probeListen;
      throw new Error(`cannot listen on ${host}:${port} (--probe-listen): ${e.code ?? e.message}`, { cause: e });
    });
    return { services, probes };
  } catch (e) {
    await closeAll(services);
    throw e;
  }
}

async function closeAll(services: readonly ClusterService[]): Promise<void> {
  for (const s of [...services].reverse()) await s.close();
}

/**
 * `vmseed cluster`: serves until SIGTERM/SIGINT. Exit 0 after a clean stop, 2
 * on a flag error, 1 when a listener cannot start.
 */
export const cluster: Command = async (ctx) => {
  const config = readConfig(ctx);
  if (typeof config === 'number') return config;
  const logger = pino({ level: config.logLevel, base: { component: 'cluster' } }, ctx.stderr);
  const metrics = createMetrics({ version: VERSION });
  let started;
  try {
    started = await startAll(config, logger, metrics);
  } catch (e) {
    ctx.stderr.write(`vmseed cluster: ${(e as Error).message}\n`);
    return 1;
  }
  const { services, probes } = started;
  logger.info(
    {
      version: VERSION,
      probes: hostPort(probes.address),
      services: Object.fromEntries(services.map((s) => [s.name, hostPort(s.address)])),
    },
    'vmseed cluster running',
  );
  await new Promise<void>((resolve) => {
    if (ctx.stopSignal.aborted) resolve();
    ctx.stopSignal.addEventListener('abort', () => resolve(), { once: true });
  });
  logger.info('stopping');
  await probes.close();
  await closeAll(services);
  return 0;
};
