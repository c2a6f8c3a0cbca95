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
import type { ClusterService } from './service.ts';

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

/**
 * Starts the webhook on --webhook-listen; its readiness is the certificate's
 * state and, with --webhook-client-ca, the client CA's. Throws naming the flag when it cannot listen.
 */
export async function startAdmission(config: ClusterConfig, logger: Logger, metrics: Metrics): Promise<ClusterService> {
  const { certDir, serial, clientAuth } = config.webhook;
  // Started only when --webhook-listen is not off (cluster-command.ts).
  const listen = config.webhook.listen!;
  const serials = serial === 'off' ? undefined : serialMinter(config.datasource.baseUrl, serial);
  let server: WebhookServer;
  try {
    server = await startWebhookServer({
      listen,
      certDir,
      logger,
      metrics,
      mutate: serials ? { serials } : {},
      ...(clientAuth ? { clientAuth } : {}),
    });
  } catch (e) {
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new Error(`cannot listen on ${listen.host}:${listen.port} (--webhook-listen): ${why}`, { cause: e });
  }
  return {
    name: 'webhook',
    address: server.address,
    readiness: () => server.problem(),
    close: async () => {
      await server.close();
    },
  };
}
