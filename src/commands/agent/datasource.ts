// Wiring of the NoCloud HTTP datasource into the agent: the node's own
// keyring from --datasource-key-file (created with --datasource-key-create,
// reloaded when it changes) and the datasource server over the agent's
// seeds. The DMI serials are not computed here: the webhook writes them,
// or `vmseed seed-url` prints them (a token on a page is a key to the seed).
import type { Logger } from 'pino';
import { startDatasourceServer, type DatasourceServer } from '../../datasource/server.ts';
import { imdsOnlySourceAddress } from '../../datasource/imds/compat.ts';
import { watchKeyFile } from '../../datasource/key-watch.ts';
import {
  createKeyFileIfMissing,
  DatasourceKeyring,
  fileKeySource,
  parseKeyFile,
  type KeySource,
} from '../../datasource/tokens.ts';
import type { DatasourceConfig } from '../../datasource/types.ts';
import type { Metrics } from '../../metrics/metrics.ts';
import type { Agent } from '../../agent/controller.ts';
import { launcherTokenReader } from '../../agent/domain/launcher-token.ts';

export type { DatasourceConfig };

export interface NocloudHttp {
  keyring: DatasourceKeyring;
  // For AgentOptions.nocloudHttp.
  agentOptions: Record<string, never>;
  // Starts the listener over the agent's seeds; close() stops it and the key watch.
  start(agent: Agent): Promise<{ server: DatasourceServer; close(): Promise<void> }>;
}

/**
 * The keyring from the key file. With `create`, a file that does not exist
 * is made first with a fresh random key (createKeyFileIfMissing: once,
 * atomically; another process's file wins a race). A file that is not there
 * (and not created) gives an empty keyring: UID and report tokens answer
 * nothing until the file appears and the watch loads it, and the agent still
 * seeds disks. Throws VmseedError DATASOURCE_KEY_FILE_UNREADABLE /
 * DATASOURCE_KEY_INVALID when the file is there but cannot be used, or
 * cannot be created.
 */
export async function loadDatasourceKeys(
  keyFile: string,
  log: Logger,
  create = false,
): Promise<{ source: KeySource; text: string | undefined; keyring: DatasourceKeyring }> {
  // Only that it was made is logged, never the key.
  if (create && (await createKeyFileIfMissing(keyFile)))
    log.info({ keyFile }, "datasource key file created with a fresh random key (this node's own)");
  const source = fileKeySource(keyFile);
  let text: string;
  try {
    text = await source.read();
  } catch (e) {
    if (((e as Error).cause as NodeJS.ErrnoException | undefined)?.code !== 'ENOENT') throw e;
    log.warn(
      { keyFile },
      'datasource key file missing; no UID or report token is answered until it appears (give --datasource-key-create true, or create it)',
    );
    return { source, text: undefined, keyring: DatasourceKeyring.empty() };
  }
  const keyring = new DatasourceKeyring(parseKeyFile(text, source.description));
  log.info({ keys: keyring.size, signing: keyring.fingerprints()[0] }, 'datasource keys loaded');
  return { source, text, keyring };
}

// Throws VmseedError DATASOURCE_KEY_FILE_UNREADABLE / DATASOURCE_KEY_INVALID
// when the key file cannot be used at start-up (no old keys to fall back on).
export async function prepareNocloudHttp(
  config: DatasourceConfig,
  logger: Logger,
  metrics?: Metrics,
): Promise<NocloudHttp> {
  const log = logger.child({ component: 'datasource' });
  const { source, text, keyring } = await loadDatasourceKeys(config.keyFile, log, config.keyCreate === true);
  return {
    keyring,
    agentOptions: {},
    async start(agent) {
      if (!agent.seeds) throw new Error('the agent was made without nocloudHttp options');
      const server = await startDatasourceServer({
        listen: config.listen,
        // IMDS compat alone: token-less answers for IMDS-annotated VMIs only.
        directory: config.imdsCompat && !config.compatSourceAddress ? imdsOnlySourceAddress(agent.seeds) : agent.seeds,
        keyring,
        logger,
        prefix: config.prefix,
        ...(metrics ? { metrics } : {}),
        compatSourceAddress: config.compatSourceAddress || config.imdsCompat === true,
        ...(config.podsDir !== undefined ? { readServiceAccountToken: launcherTokenReader(config.podsDir) } : {}),
        ...(config.imdsSession ? { imdsSessions: { mode: config.imdsSession } } : {}),
        reports: { sink: agent.provisioning },
      }).catch((e: Error) => {
        throw new Error(
          `cannot listen on ${config.listen.host}:${config.listen.port} (--datasource-listen): ${e.message}`,
        );
      });
      const watcher = watchKeyFile({
        path: config.keyFile,
        source,
        keyring,
        logger: log,
        ...(text !== undefined ? { initialText: text } : {}),
      });
      return {
        server,
        close: async () => {
          watcher.close();
          await server.close();
        },
      };
    },
  };
}
