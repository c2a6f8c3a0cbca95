// NoCloud over HTTP: the node serves each VMI's current seed the way
// KubeVirt's IMDS does (`ds=nocloud;s=http://169.254.169.254/v1/...`), on a
// listener of its own that serves nothing else (no /metrics, no /status).
//
// Who is asking is decided by a capability token in the path (see
// datasource-tokens.ts), not by headers: cloud-init cannot send any. Every
// answer that is not the seed is the same 404 (body, headers, work done),
// whether the token is malformed, unknown, signed by a removed key, or the
// seed lacks the file, so probing reveals nothing.
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { Seed } from '../cloudinit/seed.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { seedFileBytes, type DatasourceFile } from './datasource-files.ts';
import { metaDataBytes } from '../cloudinit/seed-files.ts';
import { endpointLabel, normalisePrefix, parseDatasourcePath, type DatasourceRoute } from './datasource-path.ts';
import type { DatasourceKeyring } from './datasource-tokens.ts';
import { RateLimiter } from './rate-limit.ts';
import { capConnectionsPerSource, unwrapMapped } from './connection-cap.ts';
import { challengeNonce } from '../datasource-challenge.ts';

export interface SeedDirectoryEntry {
  namespace: string;
  name: string;
  uid: string;
  seed: Seed;
}

// What the server needs from the agent. The agent implements it over its
// own state; tests implement it over a Map.
export interface SeedDirectory {
  // The current seed of the VMI with this UID, or undefined when the agent
  // has none (unknown VMI, not rendered yet, render failed).
  get(uid: string): SeedDirectoryEntry | undefined;
  // UIDs of every VMI that has a seed now. Read only when `revision` has
  // moved, to rebuild the token -> UID index.
  listUids(): Iterable<string>;
  // Bumped (any change of value) whenever the set of UIDs may have changed.
  // Changing seeds of existing UIDs need not bump it: get() is read on
  // every request.
  readonly revision: number;
  // Compat mode only: the VMI whose reported addresses
  // (status.interfaces[].ipAddress/ipAddresses) contain this address
  // (plain IPv4 or IPv6 text, IPv4-mapped IPv6 already unwrapped).
  // Must return undefined when zero VMIs OR MORE THAN ONE report it.
  byAddress(address: string): SeedDirectoryEntry | undefined;
  // A guest fetched a file (GET answered 200). For the status page's
  // "the guest fetched user-data at ...". Must not throw.
  recordFetch(namespace: string, name: string, file: DatasourceFile, at: Date): void;
}

export interface DatasourceLimits {
  // Longest request target accepted (414 beyond). Default 256: the longest
  // real path is /v1/ + 43 + / + "network-config".
  maxUrlLength?: number;
  // Per source address token bucket (429 when empty). Defaults: 20/s, burst
  // 40 (cloud-init fetches at most four files per boot, with retries).
  ratePerSecond?: number;
  burst?: number;
  maxTrackedSources?: number;
  // Header bytes per request (431 beyond), Node's own limit.
  maxHeaderBytes?: number;
  // Socket-level timeouts, so slow or idle clients do not hold sockets.
  // A connection that has not sent its whole head within headersTimeoutMs
  // (counted from the connection's start, silent ones included) is closed
  // at the next check, every connectionsCheckingIntervalMs: Node's default
  // interval is 30 s, during which one client could hold every slot.
  requestTimeoutMs?: number;
  headersTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
  connectionsCheckingIntervalMs?: number;
  maxConnections?: number;
  // Open connections per source address; more are closed on arrival, so
  // one client cannot take the slots every guest shares. Default 32
  // (cloud-init uses one or two at a time). In compat mode behind NAT or
  // QEMU user networking, all guests behind one address share it.
  maxConnectionsPerSource?: number;
}

export interface DatasourceServerOptions {
  listen: { host: string; port: number };
  directory: SeedDirectory;
  keyring: DatasourceKeyring;
  logger: Logger;
  metrics?: Metrics;
  limits?: DatasourceLimits;
  // Default `/v1`.
  prefix?: string;
  // Answer token-less `<prefix>/<file>` by the caller's source address
  // matched against the addresses VMIs report. Off by default, because the
  // source address is weak evidence of identity:
  //  - reported addresses come from the guest agent / DHCP leases, i.e. from
  //    the guest itself: a guest that claims (or spoofs, without
  //    anti-spoofing on the network) another VMI's address reads its seed,
  //    passwords and keys in user-data included;
  //  - addresses are reused: after a VMI is deleted its IP may go to another
  //    VMI before the reported status catches up (stale status = wrong seed);
  //  - NAT, proxies, QEMU user networking (guestfwd: every guest is
  //    127.0.0.1) and masquerading pod networks make many guests share one
  //    source address; the directory must then answer nothing (ambiguous),
  //    and the per-source rate limit is shared by all of them;
  //  - before the guest reports an address (first boot, when cloud-init
  //    fetches) there is nothing to match, so it gets 404 and no seed.
  // Use it only on networks where source addresses cannot be forged and
  // are unique per VMI; prefer tokens.
  compatSourceAddress?: boolean;
  // Answer an empty 200 instead of 404 for vendor-data when the seed has
  // none. cloud-init's NoCloud calls read_seeded with retries=10 and a 1 s
  // pause, and retries 404s too: a missing vendor-data costs every boot of
  // a 22.x guest ~10 s (measured: 10.4 s with Debian's 22.4). Empty
  // vendor-data means "none" to cloud-init, exactly what the image's missing
  // vendor-data file means, so this is on by default.
  serveEmptyVendorData?: boolean;
  // The same for network-config: cloud-init 24.3+ fetches it first, with the
  // same 10 retries, so a 404 costs every boot ~10 s (measured: 10.1 s with
  // 25.1). An empty network-config is no config to cloud-init (load_yaml
  // gives None), exactly what a 404 means: it falls back to DHCP. On by default.
  serveEmptyNetworkConfig?: boolean;
  // Injected for tests.
  clock?: { now(): Date; monotonicMs(): number };
}

export interface DatasourceServer {
  readonly address: AddressInfo;
  // `http://host:port` + prefix, for building seed URLs in tests.
  readonly baseUrl: string;
  close(): Promise<void>;
}

const NOT_FOUND_BODY = Buffer.from('not found\n');
const EMPTY = new Uint8Array(0);
const DECOY_TOKEN = 'A'.repeat(43);
const DECOY_UID = '\0vmseed-decoy';
const COMMON_HEADERS = {
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
} as const;

// Index key: SHA-256 of the token, not the token. The attacker chooses the
// string being looked up but not its hash, so the Map lookup's timing says
// nothing about valid tokens; the final check is constant-time (verify()).
function indexKey(token: string): string {
  return createHash('sha256').update(token).digest('base64');
}

class TokenIndex {
  #byToken = new Map<string, string>();
  #revision: number | undefined;
  #generation: number | undefined;
  readonly #directory: SeedDirectory;
  readonly #keyring: DatasourceKeyring;

  constructor(directory: SeedDirectory, keyring: DatasourceKeyring) {
    this.#directory = directory;
    this.#keyring = keyring;
  }

  resolve(token: string): string | undefined {
    if (this.#revision !== this.#directory.revision || this.#generation !== this.#keyring.generation) this.#rebuild();
    return this.#byToken.get(indexKey(token));
  }

  #rebuild(): void {
    const next = new Map<string, string>();
    this.#revision = this.#directory.revision;
    this.#generation = this.#keyring.generation;
    for (const uid of this.#directory.listUids()) {
      for (const t of this.#keyring.acceptedTokens(uid)) next.set(indexKey(t), uid);
    }
    this.#byToken = next;
  }
}

export async function startDatasourceServer(options: DatasourceServerOptions): Promise<DatasourceServer> {
  const { directory, keyring, metrics } = options;
  const logger = options.logger.child({ component: 'datasource' });
  const prefix = normalisePrefix(options.prefix ?? '/v1');
  const limits = options.limits ?? {};
  const maxUrlLength = limits.maxUrlLength ?? 256;
  const clock = options.clock ?? { now: () => new Date(), monotonicMs: () => performance.now() };
  const limiter = new RateLimiter({
    ratePerSecond: limits.ratePerSecond ?? 20,
    burst: limits.burst ?? 40,
    maxKeys: limits.maxTrackedSources ?? 10_000,
    now: () => clock.monotonicMs(),
  });
  const index = new TokenIndex(directory, keyring);
  const metaDataCache = new WeakMap<Seed, Uint8Array>();

  function bytesOf(seed: Seed, file: DatasourceFile): Uint8Array | undefined {
    if (file !== 'meta-data' || seed.datasource !== 'nocloud') return seedFileBytes(seed, file);
    let b = metaDataCache.get(seed);
    if (b === undefined) {
      b = metaDataBytes(seed);
      metaDataCache.set(seed, b);
    }
    return b;
  }

  function lookup(route: DatasourceRoute, source: string): SeedDirectoryEntry | undefined {
    if (route.kind === 'compat') {
      return options.compatSourceAddress ? directory.byAddress(source) : undefined;
    }
    const uid = index.resolve(route.token);
    if (uid === undefined) {
      equalise(route.token);
      return undefined;
    }
    // The index may be stale by one VMI deletion; get() is the truth, and
    // verify() re-checks the token against the keys in force now.
    const entry = directory.get(uid);
    if (entry === undefined || entry.uid !== uid || !keyring.verify(route.token, uid)) return undefined;
    return entry;
  }

  // The HMAC work a found token costs, done for misses too, so response
  // time does not tell a known token from an unknown one.
  function equalise(token: string): void {
    keyring.verify(token, DECOY_UID);
  }

  function send(
    res: ServerResponse,
    status: number,
    body: Uint8Array,
    head: boolean,
    extra: Record<string, string> = {},
  ): void {
    res.writeHead(status, {
      ...COMMON_HEADERS,
      'Content-Type': extra['Content-Type'] ?? 'text/plain; charset=utf-8',
      'Content-Length': String(body.byteLength),
      ...extra,
    });
    res.end(head ? undefined : body);
  }

  function handle(req: IncomingMessage, res: ServerResponse): { status: number; route: DatasourceRoute | undefined } {
    const target = req.url ?? '';
    const head = req.method === 'HEAD';
    const source = unwrapMapped(req.socket.remoteAddress ?? '');

    if (!limiter.take(source)) {
      send(res, 429, Buffer.from('too many requests\n'), head, { 'Retry-After': '1' });
      return { status: 429, route: undefined };
    }
    if (target.length > maxUrlLength) {
      send(res, 414, Buffer.from('request target too long\n'), head, { Connection: 'close' });
      return { status: 414, route: undefined };
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(res, 405, Buffer.from('method not allowed\n'), false, { Allow: 'GET, HEAD', Connection: 'close' });
      return { status: 405, route: undefined };
    }
    // No body on a seed request: anything announcing one is refused and the
    // connection closed, so we never read it.
    const cl = req.headers['content-length'];
    if (req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0')) {
      send(res, 400, Buffer.from('request body not accepted\n'), head, { Connection: 'close' });
      return { status: 400, route: undefined };
    }

    // The redirect sidecar asking whether its DNAT target is this listener.
    const nonce = challengeNonce(target);
    if (nonce !== undefined) {
      send(res, 200, Buffer.from(`${keyring.challengeAnswers(nonce).join('\n')}\n`), head);
      return { status: 200, route: undefined };
    }
    const route = parseDatasourcePath(target, prefix);
    if (route === undefined) {
      index.resolve(DECOY_TOKEN);
      equalise(DECOY_TOKEN);
    }
    const entry = route === undefined ? undefined : lookup(route, source);
    let bytes = entry === undefined || route === undefined ? undefined : bytesOf(entry.seed, route.file);
    if (
      bytes === undefined &&
      entry?.seed.datasource === 'nocloud' &&
      route?.file === 'vendor-data' &&
      (options.serveEmptyVendorData ?? true)
    ) {
      bytes = EMPTY;
    }
    if (
      bytes === undefined &&
      entry?.seed.datasource === 'nocloud' &&
      route?.file === 'network-config' &&
      (options.serveEmptyNetworkConfig ?? true)
    ) {
      bytes = EMPTY;
    }
    if (route === undefined || entry === undefined || bytes === undefined) {
      send(res, 404, NOT_FOUND_BODY, head);
      return { status: 404, route };
    }
    const textual = route.file === 'meta-data' || route.file === 'network-config';
    send(res, 200, bytes, head, {
      'Content-Type': textual ? 'text/plain; charset=utf-8' : 'application/octet-stream',
    });
    if (!head) {
      try {
        directory.recordFetch(entry.namespace, entry.name, route.file, clock.now());
      } catch (e) {
        logger.warn({ err: { message: (e as Error).message } }, 'recordFetch failed');
      }
      logger.debug(
        { namespace: entry.namespace, name: entry.name, file: route.file, via: route.kind },
        'served seed file',
      );
    }
    return { status: 200, route };
  }

  const server: Server = createServer(
    {
      maxHeaderSize: limits.maxHeaderBytes ?? 8192,
      requestTimeout: limits.requestTimeoutMs ?? 5_000,
      headersTimeout: limits.headersTimeoutMs ?? 3_000,
      keepAliveTimeout: limits.keepAliveTimeoutMs ?? 5_000,
      connectionsCheckingInterval: limits.connectionsCheckingIntervalMs ?? 500,
    },
    (req, res) => {
      const started = performance.now();
      let status = 500;
      let route: DatasourceRoute | undefined;
      try {
        ({ status, route } = handle(req, res));
      } catch (e) {
        // Never a stack trace or message to the client; the log gets the
        // message only (it cannot contain seed bytes: nothing here parses them).
        logger.error({ err: { message: (e as Error)?.message } }, 'datasource request failed');
        if (!res.headersSent)
          send(res, 500, Buffer.from('internal error\n'), req.method === 'HEAD', { Connection: 'close' });
        else res.destroy();
      }
      if (metrics) {
        const endpoint = endpointLabel(route);
        metrics.datasourceRequests.inc({ endpoint, status: String(status) });
        metrics.datasourceRequestDuration.observe({ endpoint }, (performance.now() - started) / 1000);
      }
    },
  );
  server.maxConnections = limits.maxConnections ?? 1024;
  capConnectionsPerSource(server, limits.maxConnectionsPerSource ?? 32, () =>
    metrics?.datasourceConnectionsRefused.inc(),
  );
  // Malformed HTTP (bad request line, oversized headers): answer plainly,
  // with the same no-store header, and close.
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    if (!socket.writable) return socket.destroy();
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
    // Destroyed once the answer is handed to the kernel: end() alone would
    // keep the socket (and the source's connection slot) until the client
    // closes its side, which a client that never reads never does.
    socket.end(`HTTP/1.1 ${status}\r\nCache-Control: no-store\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`, () =>
      socket.destroy(),
    );
    metrics?.datasourceRequests.inc({ endpoint: 'other', status: status.slice(0, 3) });
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.listen.port, options.listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  logger.info(
    { address: address.address, port: address.port, prefix, compatSourceAddress: !!options.compatSourceAddress },
    'NoCloud HTTP datasource listening',
  );
  return {
    address,
    baseUrl: `http://${host}:${address.port}${prefix}`,
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      }),
  };
}

// `--datasource-listen` value: `host:port`, `[v6]:port` or `:port` (all
// addresses). Throws RangeError with a message fit for the CLI.
export function parseListen(value: string): { host: string; port: number } {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(value);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535)
    throw new RangeError(`listen address '${value}' must look like 127.0.0.1:8081, [::1]:8081 or :8081`);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port };
}
