// `vmseed redirect`: the small privileged part of the NoCloud-over-HTTP
// setup. Runs in its own container with CAP_NET_ADMIN on the host network
// and keeps a DNAT of 169.254.169.254:80 from launcher pods (the addresses
// the agent writes to --launchers-file) to the agent's datasource listener
// (src/redirect). The agent itself stays unprivileged.
import { watch, type FSWatcher } from 'node:fs';
import { basename, dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { parseListen, ConfigError } from '../config/values.ts';
import { isVmseedError } from '../errors.ts';
import { startRedirectHealth } from '../redirect/health-server.ts';
import { execNft, RedirectKeeper } from '../redirect/keeper.ts';
import { targetChecker } from '../redirect/target-check.ts';
import { fileKeySource, parseKeyFile } from '../datasource/tokens.ts';
import { createRedirectMetrics } from '../redirect/redirect-metrics.ts';
import { LAUNCHER_FILE_NAME, readLauncherFile } from '../redirect/launcher-file.ts';
import {
  DEFAULT_POD_INTERFACES,
  DEFAULT_TABLE,
  checkSpec,
  renderRuleset,
  type RedirectSpec,
} from '../redirect/nft-ruleset.ts';
import { UsageError, type Command } from './cli.ts';

/** The --launchers-file default: the agent's file in the directory both containers mount. */
export const DEFAULT_LAUNCHERS_FILE = `/run/vmseed/launchers/${LAUNCHER_FILE_NAME}`;

const HELP = `usage: vmseed redirect --to HOST:PORT [options]

Keeps an nftables DNAT of tcp 169.254.169.254:80 arriving on pod interfaces
from this node's launcher pods (the addresses the agent writes to
--launchers-file) to the NoCloud datasource listener, in a table of its own
(never kube-proxy's or the CNI's); every other pod keeps the cloud's own
metadata service. Re-applies it when it is flushed, follows the file, and
removes it on SIGTERM. Needs CAP_NET_ADMIN in the host network namespace.

options:
  --to HOST:PORT          the datasource listener as the node reaches it (e.g. $(HOST_IP):8081)
  --pod-interface PATTERN interface pods' traffic arrives on, trailing * allowed; repeatable
                          (default ${DEFAULT_POD_INTERFACES.join(' ')})
  --listen HOST:PORT      /healthz, /readyz (200 while the rule is in place), /metrics (default 0.0.0.0:8082)
  --datasource-key-file FILE
                          the agent's datasource key file (the same Secret): /readyz is 200 only
                          once the --to target answers the datasource's challenge with these keys,
                          so a rule pointing at another service is not "in place"
  --launchers-file FILE   the agent's list of this node's launcher pod addresses (its
                          --launcher-addresses-file, in a directory both containers mount);
                          read when it changes and every --interval; missing: no pod redirected
                          (default ${DEFAULT_LAUNCHERS_FILE})
  --all-pods              redirect every pod's 169.254.169.254, not only launchers' (takes the
                          cloud's metadata service from every pod on the node)
  --session-hop-limit N   set IP TTL N on the answers of redirected connections that open with
                          no plain GET/HEAD/POST (the agent's PUT /v1/session, with
                          --datasource-imds-session), so a session token crosses at most N-1
                          routed hops past the node: 2 reaches a masquerade-bound guest and no
                          container nested in it (default: off, no TTL is changed)
  --interval SECONDS      how often the rule is checked and re-applied when gone (default 5)
  --table NAME            the nftables table, family ip (default ${DEFAULT_TABLE})
  --metadata-address IP   default 169.254.169.254
  --metadata-port PORT    default 80
  --print                 print the ruleset and exit
  --remove                remove the table and exit
  --log-level LEVEL       default info
`;

function specFrom(values: Record<string, string | string[] | boolean | undefined>): RedirectSpec {
  const to = values.to as string | undefined;
  if (to === undefined)
    throw new UsageError('--to HOST:PORT is required (the datasource listener, e.g. the node address and port 8081)');
  const target = parseListen(to, 'to');
  const port = Number(values['metadata-port'] ?? '80');
  const ifaces = (values['pod-interface'] as string[] | undefined) ?? DEFAULT_POD_INTERFACES;
  return checkSpec({
    table: (values.table as string | undefined) ?? DEFAULT_TABLE,
    to: target,
    podInterfaces: ifaces
      .flatMap((s) => s.split(','))
      .map((s) => s.trim())
      .filter((s) => s !== ''),
    metadata: { address: (values['metadata-address'] as string | undefined) ?? '169.254.169.254', port },
    ...(values['all-pods'] === true ? { allPods: true } : {}),
    ...(values['session-hop-limit'] !== undefined
      ? { sessionHopLimit: hopLimit(values['session-hop-limit'] as string) }
      : {}),
  });
}

// Digits only: Number() would take ' 2', '0x2' or '2e0'.
function hopLimit(text: string): number {
  if (!/^[0-9]{1,3}$/.test(text))
    throw new UsageError(`--session-hop-limit: '${text}' is not a whole number of hops from 1 to 255`);
  return Number(text);
}

/**
 * `vmseed redirect`: keeps the nftables DNAT of the metadata address to --to
 * until SIGTERM, which removes it; --print and --remove act once and exit.
 * Exit 2 on bad flags (before anything listens), 1 when the health listener
 * cannot bind or the rule cannot be removed. --datasource-key-file is no
 * start-time input: the agent writes it (maybe after this starts), and until
 * it is readable /readyz says so.
 */
export const redirect: Command = async (ctx) => {
  let values;
  let spec: RedirectSpec;
  try {
    ({ values } = parseArgs({
      args: ctx.argv,
      options: {
        to: { type: 'string' },
        'pod-interface': { type: 'string', multiple: true },
        listen: { type: 'string', default: '0.0.0.0:8082' },
        'datasource-key-file': { type: 'string' },
        interval: { type: 'string', default: '5' },
        'launchers-file': { type: 'string', default: DEFAULT_LAUNCHERS_FILE },
        'all-pods': { type: 'boolean', default: false },
        'session-hop-limit': { type: 'string' },
        table: { type: 'string' },
        'metadata-address': { type: 'string' },
        'metadata-port': { type: 'string' },
        print: { type: 'boolean', default: false },
        remove: { type: 'boolean', default: false },
        'log-level': { type: 'string', default: 'info' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    }));
    if (values.help) {
      ctx.stdout.write(HELP);
      return 0;
    }
    spec = specFrom(values);
  } catch (e) {
    if (
      e instanceof UsageError ||
      e instanceof ConfigError ||
      isVmseedError(e) ||
      (e as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')
    ) {
      ctx.stderr.write(`vmseed redirect: ${(e as Error).message}\n`);
      return 2;
    }
    throw e;
  }
  if (values.print) {
    ctx.stdout.write(renderRuleset(spec));
    return 0;
  }
  const interval = Number(values.interval);
  if (!Number.isFinite(interval) || interval < 0.1 || interval > 3600) {
    ctx.stderr.write('vmseed redirect: --interval must be seconds between 0.1 and 3600\n');
    return 2;
  }
  let listen;
  try {
    listen = parseListen(values.listen, 'listen');
  } catch (e) {
    ctx.stderr.write(`vmseed redirect: ${(e as Error).message}\n`);
    return 2;
  }
  const logger = pino({ level: values['log-level'] }, ctx.stderr);
  const metrics = createRedirectMetrics();
  const keyFile = values['datasource-key-file'];
  const launchersFile = values['launchers-file'];
  let skippedLogged = -1;
  const keeper = new RedirectKeeper({
    launchers: async () => {
      const { addresses, skipped } = await readLauncherFile(launchersFile);
      if (skipped !== skippedLogged && skipped > 0)
        logger.warn({ launchersFile, skipped }, 'lines of the launcher file that are no IPv4 address were skipped');
      skippedLogged = skipped;
      return addresses;
    },
    spec,
    runner: execNft(),
    logger,
    metrics,
    intervalMs: interval * 1000,
    ...(keyFile !== undefined
      ? {
          verifyTarget: targetChecker({
            to: spec.to,
            keys: async () => {
              const source = fileKeySource(keyFile);
              return parseKeyFile(await source.read(), source.description);
            },
          }),
        }
      : {}),
  });
  if (values.remove) {
    await keeper.stop();
    return 0;
  }
  let health;
  try {
    health = await startRedirectHealth({ listen, keeper, metrics });
  } catch (e) {
    // The invocation was right; the listener cannot bind (in use, EACCES).
    ctx.stderr.write(
      `vmseed redirect: cannot listen on ${values.listen} (--listen): ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}\n`,
    );
    return 1;
  }
  logger.info({ listen: `${health.address.address}:${health.address.port}` }, 'redirect health listening');
  await keeper.start();
  const watcher = spec.allPods === true ? undefined : watchLaunchers(launchersFile, () => void keeper.refresh());
  await new Promise<void>((resolve) => {
    if (ctx.stopSignal.aborted) resolve();
    ctx.stopSignal.addEventListener('abort', () => resolve(), { once: true });
  });
  watcher?.close();
  let code: 0 | 1 = 0;
  try {
    await keeper.stop();
  } catch (e) {
    logger.error({}, (e as Error).message);
    code = 1;
  }
  await health.close();
  return code;
};

// The file is replaced by a rename, so its directory is watched; the
// interval's reads cover a directory that cannot be watched (not there yet).
function watchLaunchers(path: string, changed: () => void): FSWatcher | undefined {
  let timer: NodeJS.Timeout | undefined;
  try {
    const w = watch(dirname(path), (_event, name) => {
      if (name !== null && name !== basename(path)) return;
      clearTimeout(timer);
      timer = setTimeout(changed, 50);
    });
    w.on('error', () => w.close());
    return w;
  } catch {
    return undefined;
  }
}
