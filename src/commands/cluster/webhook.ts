// Wiring of the admission webhook into the cluster component: the serial
// minter and the HTTPS listener. The webhook holds no key: each serial it
// writes carries a fresh random token, which the node agents recognise
// because it is in the VMI's own spec (src/datasource/identity.ts).
import type { Logger } from 'pino';
import type { ClusterConfig } from '../../config/cluster-config.ts';
import type { Metrics } from '../../metrics/metrics.ts';
import { randomToken } from '../../datasource/tokens.ts';
import { datasourceSeedUrl, datasourceSerial, type SerialDatasourceId } from '../../datasource/url.ts';
import type { SerialMinter } from '../../cluster/webhook/mutate.ts';
import { startWebhookServer, type WebhookServer } from '../../cluster/webhook/webhook-server.ts';
import { WORKER_MIN_BYTES, type SchemaWarningOptions } from '../../cluster/webhook/schema-warnings.ts';
import type { RefResolver } from '../../api/objects.ts';
import type { KubeApi } from '../../kube/api-client.ts';
import type { CiProfile } from '../../cloudinit/schema/ci-validator.ts';
import { schemaStore } from '../../cloudinit/schema/schema-store.ts';
import type { ClusterService } from './service.ts';
import { KubeAdoptionEvents, type AdoptionEvents } from '../../cluster/webhook/adoption-events.ts';
import { hostname } from 'node:os';

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Serials of `base` with a fresh random token each; recognises ours in either ds= form. */
export function serialMinter(base: string, ds: SerialDatasourceId): SerialMinter {
  const ours = new RegExp(`^ds=nocloud(-net)?;s=${escapeRegExp(base.replace(/\/+$/, ''))}/[A-Za-z0-9_-]{43}/$`);
  return {
    serial: () => datasourceSerial(datasourceSeedUrl(base, randomToken()), ds),
    isOurs: (serial) => ours.test(serial),
  };
}

// The schema warnings' set-up (--cloud-init-schemas, --cloud-init-version):
// the releases whose files are there (logged once when one is not), a
// worker pool for large documents, and the component's API credentials for
// the Secrets a VMI's data comes from. Never fails the start: what is
// missing turns the check (or the Secret reads) off, and the log says why.
async function schemaWarningSetup(
  config: ClusterConfig,
  logger: Logger,
  api: ApiAccess,
): Promise<{ options?: SchemaWarningOptions; close(): Promise<void> }> {
  const log = logger.child({ component: 'webhook' });
  const { schemaDir, release } = config.cloudInit;
  if (release === 'off') {
    log.info('cloud-init schema warnings off (--cloud-init-version off)');
    return { close: async () => {} };
  }
  const store = schemaStore(schemaDir);
  const available = new Set<CiProfile>();
  for (const s of store.status()) {
    if (s.state === 'ready') available.add(s.release);
    else
      log.warn(
        { release: s.release, dir: schemaDir, reason: s.reason },
        'cloud-init schemas not available: no warnings for this release',
      );
  }
  if (available.size === 0) return { close: async () => {} };
  const { RenderPool } = await import('../../agent/render-pool.ts');
  // Compiled now, not at an admission (a few hundred ms each on the event loop).
  for (const r of available) store.validator(r, 'cloud-config');
  // One worker, kept a day once idle and started now: its cold start (a
  // few seconds) would not fit an admission's 2 s budget.
  const pool = new RenderPool({ size: 1, maxQueue: 8, deadlineMs: 5_000, idleMs: 86_400_000 });
  pool
    .run('checkSchemas', [{ dir: schemaDir, release: [...available][0], reveal: false }], WORKER_MIN_BYTES)
    .catch((e: unknown) => log.warn({ reason: (e as Error).message }, 'cloud-init schema worker did not start'));
  return {
    options: {
      dir: schemaDir,
      release,
      available,
      runner: pool,
      ...(api.secrets ? { secrets: api.secrets } : {}),
      ...(api.unavailable ? { secretsUnavailable: api.unavailable } : {}),
    },
    close: () => pool.close(),
  };
}

// What the webhook reads and writes with the component's own API
// credentials (--kubeconfig, else the in-cluster service account): the
// Secrets a VMI's cloud-init data comes from, and the Events of skipped
// adoptions. Without credentials both are off, and the log says why once.
interface ApiAccess {
  secrets?: RefResolver;
  // The VirtualMachines that vouch for their VMIs' reviews.
  vms?: KubeApi;
  events?: AdoptionEvents;
  unavailable?: string;
  close(): Promise<void>;
}

async function apiAccess(config: ClusterConfig, logger: Logger): Promise<ApiAccess> {
  const [{ loadConnection }, { KubeConnectionApi }, { KubeRefResolver }] = await Promise.all([
    import('../../kube/connection.ts'),
    import('../../kube/api-client.ts'),
    import('../../kube/resolver.ts'),
  ]);
  try {
    const connection = await loadConnection(config.kubeconfig);
    const api = new KubeConnectionApi(connection);
    const events = new KubeAdoptionEvents({ api, logger: logger.child({ component: 'webhook' }), host: hostname() });
    return {
      secrets: new KubeRefResolver(api),
      vms: api,
      events,
      close: async () => {
        await events.flush();
        await connection.close();
      },
    };
  } catch (e) {
    logger
      .child({ component: 'webhook' })
      .warn(
        { reason: (e as Error).message },
        'no API credentials: Secret-backed cloud-init data is neither checked nor adopted',
      );
    return { unavailable: `no API credentials (${(e as Error).message})`, close: async () => {} };
  }
}

/**
 * Starts the webhook on --webhook-listen; its readiness is the certificate's
 * state and, with --webhook-client-ca, the client CA's. Throws naming the flag when it cannot listen.
 */
export async function startAdmission(config: ClusterConfig, logger: Logger, metrics: Metrics): Promise<ClusterService> {
  const { certDir, serial, clientAuth } = config.webhook;
  // Started only when --webhook-listen is not off (cluster-command.ts).
  const listen = config.webhook.listen!;
  const serials = serial === 'off' ? undefined : serialMinter(config.datasource.baseUrl, serial);
  const api = await apiAccess(config, logger);
  const schemas = await schemaWarningSetup(config, logger, api);
  const adoption = {
    ...(api.secrets ? { secrets: api.secrets } : {}),
    ...(api.unavailable ? { secretsUnavailable: api.unavailable } : {}),
    ...(api.events ? { events: api.events } : {}),
  };
  let server: WebhookServer;
  try {
    server = await startWebhookServer({
      listen,
      certDir,
      logger,
      metrics,
      mutate: serials ? { serials } : {},
      ...(clientAuth ? { clientAuth } : {}),
      ...(schemas.options ? { schemas: schemas.options } : {}),
      adoption,
      ...(api.vms ? { vms: api.vms } : {}),
    });
  } catch (e) {
    await schemas.close();
    await api.close();
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new Error(`cannot listen on ${listen.host}:${listen.port} (--webhook-listen): ${why}`, { cause: e });
  }
  return {
    name: 'webhook',
    address: server.address,
    readiness: () => server.problem(),
    close: async () => {
      await server.close();
      await schemas.close();
      await api.close();
    },
  };
}
