// Wiring of the admission webhook into the agent: the serial minter over the
// datasource key file (its own keyring, reloaded as the datasource's is) and
// the HTTPS listener. The webhook signs with the key the datasource verifies
// with, so both read one Secret.
import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { Metrics } from '../../metrics/metrics.ts';
import type { DatasourceConfig } from './datasource.ts';
import { loadDatasourceKeys } from './datasource.ts';
import { watchKeyFile } from '../../datasource/key-watch.ts';
import type { DatasourceKeyring } from '../../datasource/tokens.ts';
import { datasourceSeedUrl, datasourceSerial, type SerialDatasourceId } from '../../datasource/url.ts';
import type { SerialMinter } from '../../cluster/webhook/mutate.ts';
import { startWebhookServer, type WebhookServer } from '../../cluster/webhook/webhook-server.ts';

export interface AdmissionConfig {
  listen: { host: string; port: number };
  certDir: string;
  serial: 'off' | SerialDatasourceId;
}

export interface Admission {
  // For Status.addReadinessCheck: why the webhook cannot serve, or undefined.
  readonly readiness: () => Promise<string | undefined>;
  close(): Promise<void>;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

// Serials of `base`, with a token in either ds= form.
export function serialMinter(keyring: DatasourceKeyring, base: string, ds: SerialDatasourceId): SerialMinter {
  const ours = new RegExp(`^ds=nocloud(-net)?;s=${escapeRegExp(base.replace(/\/+$/, ''))}/[A-Za-z0-9_-]{43}/$`);
  return {
    serial: (binding) =>
      keyring.size === 0 ? undefined : datasourceSerial(datasourceSeedUrl(base, keyring.sign(binding)), ds),
    isOurs: (serial) => ours.test(serial),
  };
}

export function newNonce(): string {
  return randomBytes(16).toString('base64url');
}

export async function startAdmission(
  config: AdmissionConfig,
  datasource: DatasourceConfig | undefined,
  logger: Logger,
  metrics?: Metrics,
): Promise<Admission> {
  const log = logger.child({ component: 'webhook' });
  let serials: SerialMinter | undefined;
  let closeKeys = () => {};
  if (config.serial !== 'off' && datasource) {
    const { source, text, keyring } = await loadDatasourceKeys(datasource.keyFile, log);
    const watcher = watchKeyFile({
      path: datasource.keyFile,
      source,
      keyring,
      logger: log,
      ...(text !== undefined ? { initialText: text } : {}),
    });
    closeKeys = () => watcher.close();
    serials = serialMinter(keyring, datasource.baseUrl, config.serial);
  }
  let server: WebhookServer;
  try {
    server = await startWebhookServer({
      listen: config.listen,
      certDir: config.certDir,
      logger,
      mutate: { newNonce, ...(serials ? { serials } : {}) },
      ...(metrics ? { metrics } : {}),
    });
  } catch (e) {
    closeKeys();
    throw new Error(
      `cannot listen on ${config.listen.host}:${config.listen.port} (--webhook-listen): ${(e as Error).message}`,
      { cause: e },
    );
  }
  return {
    readiness: async () => server.problem(),
    close: async () => {
      closeKeys();
      await server.close();
    },
  };
}
