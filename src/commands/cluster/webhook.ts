// Wiring of the admission webhook into the cluster component: the serial
// minter over the datasource key file (its own keyring, reloaded as the
// agents' is) and the HTTPS listener. The serial's token is signed with the
// key the agents' datasource verifies with, so both read one Secret; without
// --datasource-key-file the webhook gates VMIs and writes no serial.
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { ClusterConfig } from '../../config/cluster-config.ts';
import type { Metrics } from '../../metrics/metrics.ts';
import { loadDatasourceKeys } from '../agent/datasource.ts';
import { watchKeyFile } from '../../datasource/key-watch.ts';
import type { DatasourceKeyring } from '../../datasource/tokens.ts';
import { datasourceSeedUrl, datasourceSerial, type SerialDatasourceId } from '../../datasource/url.ts';
import type { SerialMinter } from '../../cluster/webhook/mutate.ts';
import { startWebhookServer, type WebhookServer } from '../../cluster/webhook/webhook-server.ts';
import type { ClusterService } from './service.ts';

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Serials of `base`, with a token in either ds= form, signed with the keyring's signing key. */
export function serialMinter(keyring: DatasourceKeyring, base: string, ds: SerialDatasourceId): SerialMinter {
  const ours = new RegExp(`^ds=nocloud(-net)?;s=${escapeRegExp(base.replace(/\/+$/, ''))}/[A-Za-z0-9_-]{43}/$`);
  return {
    serial: (binding) =>
      keyring.size === 0 ? undefined : datasourceSerial(datasourceSeedUrl(base, keyring.sign(binding)), ds),
    isOurs: (serial) => ours.test(serial),
  };
}

/** A fresh datasource nonce for a VMI the webhook admits. */
export function newNonce(): string {
  return randomBytes(16).toString('base64url');
}

/**
 * Starts the webhook on --webhook-listen; its readiness is the certificate's
 * state. Throws naming the flag when it cannot listen.
 */
export async function startAdmission(config: ClusterConfig, logger: Logger, metrics: Metrics): Promise<ClusterService> {
  const log = logger.child({ component: 'webhook' });
  const { listen, certDir, serial } = config.webhook;
  let serials: SerialMinter | undefined;
  let closeKeys = () => {};
  if (serial !== 'off' && config.datasource) {
    const { keyFile, baseUrl } = config.datasource;
    const { source, text, keyring } = await loadDatasourceKeys(keyFile, log);
    const watcher = watchKeyFile({
      path: keyFile,
      source,
      keyring,
      logger: log,
      ...(text !== undefined ? { initialText: text } : {}),
    });
    closeKeys = () => watcher.close();
    serials = serialMinter(keyring, baseUrl, serial);
  }
  let server: WebhookServer;
  try {
    server = await startWebhookServer({
      listen,
      certDir,
      logger,
      metrics,
      mutate: { newNonce, ...(serials ? { serials } : {}) },
    });
  } catch (e) {
    closeKeys();
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new Error(`cannot listen on ${listen.host}:${listen.port} (--webhook-listen): ${why}`, { cause: e });
  }
  return {
    name: 'webhook',
    address: server.address,
    readiness: () => server.problem(),
    close: async () => {
      closeKeys();
      await server.close();
    },
  };
}
