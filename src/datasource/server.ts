// NoCloud over HTTP: the node serves each VMI's current seed the way
// KubeVirt's IMDS does (`ds=nocloud;s=http://169.254.169.254/v1/...`), on a
// listener of its own that serves nothing else (no /metrics, no /status).
//
// Who is asking is decided by a capability token in the path (see
// datasource-tokens.ts), not by headers: cloud-init cannot send any. Every
// answer that is not the seed is the same 404 (body, headers, work done),
// whether the token is malformed, unknown, signed by a removed key, or the
// seed lacks the file, so probing reveals nothing.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/metrics.ts';
import type { DatasourceFile } from './files.ts';
import type { DatasourceLimits, SeedDirectory, SeedDirectoryEntry } from './types.ts';
import { endpointLabel, normalisePrefix, parseDatasourcePath, type DatasourceRoute } from './nocloud-paths.ts';
import type { DatasourceKeyring } from './tokens.ts';
import { unwrapMapped } from '../core/connection-cap.ts';
import { SeedIdentity } from './identity.ts';
import { SeedFileBytes } from './bytes.ts';
import { RequestScreen } from './flood/screen.ts';
import { createDatasourceListener } from './listener.ts';
import { listen } from '../core/listen.ts';
import { challengeNonce } from '../redirect/challenge.ts';
import { ImdsEndpoints } from './imds/endpoints.ts';
import type { ImdsGuardLimits } from './imds/guards.ts';
import type { ServiceAccountTokenReader } from './imds/token-endpoint.ts';
import type { SessionMode } from './imds/session-endpoint.ts';
import type { SessionLimits } from './imds/sessions.ts';
import { noteRequest } from './imds/connection-order.ts';
import { ReportReceiver, type ProgressSink, type ReportLimits } from './reports/receiver.ts';
import { EarlyMisses, type EarlyMissLimits } from './early.ts';
import { holdConnection } from './flood/connection-hold.ts';
import { FORWARDING_HEADERS, forwardingHeader, refuseForwarded, type ForwardingHeader } from './forwarded.ts';
import { LogThrottle } from '../core/log-throttle.ts';

export interface DatasourceServerOptions {
  listen: { host: string; port: number };
  directory: SeedDirectory;
  keyring: DatasourceKeyring;
  logger: Logger;
  metrics?: Metrics;
  limits?: DatasourceLimits;
  // Default `/v1`.
  prefix?: string;
  // Answer token-less `<prefix>/<file>` by the caller's source address:
  // where the directory knows launcher pods (SeedDirectory.launcherAt), the
  // VMI whose launcher pod has it, and none of what follows applies but the
  // last two points. Otherwise it is matched against the addresses VMIs
  // report. Off by default, because the source address is weak evidence of
  // identity:
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
  // a 22.x guest those ten pauses (measured: docs/operations.md, "NoCloud
  // over HTTP"). Empty vendor-data means "none" to cloud-init, exactly what
  // the image's missing vendor-data file means, so this is on by default.
  serveEmptyVendorData?: boolean;
  // The same for network-config: cloud-init 24.3+ fetches it first, with the
  // same 10 retries, so a 404 costs every boot those pauses too (measured:
  // docs/operations.md, "NoCloud over HTTP"). An empty network-config is no
  // config to cloud-init (load_yaml gives None), exactly what a 404 means: it
  // falls back to DHCP. On by default.
  serveEmptyNetworkConfig?: boolean;
  // Tokens that found no seed, remembered to tell a guest that looked
  // before its seed existed (src/datasource/early.ts).
  earlyMisses?: EarlyMissLimits;
  // Injected for tests.
  clock?: { now(): Date; monotonicMs(): number };
  // The IMDS endpoints' guards (imds-guards.ts) and where /v1/token reads
  // a VMI's ServiceAccount token; without a reader /v1/token answers 500.
  imdsLimits?: ImdsGuardLimits;
  readServiceAccountToken?: ServiceAccountTokenReader;
  // --datasource-imds-session: `PUT <prefix>/session` and the session check
  // of /v1/identity and /v1/token (imds/session-endpoint.ts). Default off.
  imdsSessions?: { mode: SessionMode; limits?: SessionLimits };
  // Accept cloud-init's progress events (POST <prefix>/<report token>/cloud-init-events).
  reports?: { sink: ProgressSink; limits?: ReportLimits };
}

/** A listening datasource, as startDatasourceServer resolves it. */
export interface DatasourceServer {
  readonly address: AddressInfo;
  // `http://host:port` + prefix, for building seed URLs in tests.
  readonly baseUrl: string;
  close(): Promise<void>;
}

const NOT_FOUND_BODY = Buffer.from('not found\n');
const INTERNAL_ERROR_BODY = Buffer.from('internal error\n');
const COMMON_HEADERS = {
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
} as const;
const SYSTEM_CLOCK = { now: () => new Date(), monotonicMs: () => performance.now() };

// Property-typed: the rate limiter is handed monotonicMs itself, as a plain function.
interface Clock {
  now: () => Date;
  monotonicMs: () => number;
}

// What one request came to, for the metrics.
interface Outcome {
  status: number;
  route: DatasourceRoute | undefined;
  // Answered by the IMDS endpoints.
  imds?: true;
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

function sendFile(res: ServerResponse, file: DatasourceFile, bytes: Uint8Array, head: boolean): void {
  const textual = file === 'meta-data' || file === 'network-config';
  send(res, 200, bytes, head, {
    'Content-Type': textual ? 'text/plain; charset=utf-8' : 'application/octet-stream',
  });
}

// Answers one request: screened, routed, its VMI resolved, its file sent.
class SeedRequestHandler {
  readonly #prefix: string;
  readonly #screen: RequestScreen;
  readonly #identity: SeedIdentity;
  readonly #keyring: DatasourceKeyring;
  readonly #bytes: SeedFileBytes;
  readonly #directory: SeedDirectory;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #imds: ImdsEndpoints;
  readonly #early: EarlyMisses;

  constructor(options: DatasourceServerOptions, prefix: string, clock: Clock, logger: Logger) {
    const limits = options.limits ?? {};
    this.#prefix = prefix;
    this.#screen = new RequestScreen({
      maxUrlLength: limits.maxUrlLength ?? 256,
      ratePerSecond: limits.ratePerSecond ?? 20,
      burst: limits.burst ?? 40,
      maxTrackedSources: limits.maxTrackedSources ?? 10_000,
      now: clock.monotonicMs,
    });
    this.#identity = new SeedIdentity(options.directory, options.keyring, !!options.compatSourceAddress);
    this.#keyring = options.keyring;
    this.#bytes = new SeedFileBytes({
      serveEmptyVendorData: options.serveEmptyVendorData ?? true,
      serveEmptyNetworkConfig: options.serveEmptyNetworkConfig ?? true,
    });
    this.#directory = options.directory;
    this.#clock = clock;
    this.#logger = logger;
    this.#imds = new ImdsEndpoints({
      prefix,
      identity: this.#identity,
      logger,
      now: clock.monotonicMs,
      ...(options.imdsLimits ? { limits: options.imdsLimits } : {}),
      ...(options.metrics ? { metrics: options.metrics } : {}),
      ...(options.readServiceAccountToken ? { readToken: options.readServiceAccountToken } : {}),
      ...(options.imdsSessions ? { sessions: options.imdsSessions, directory: options.directory } : {}),
    });
    this.#early = new EarlyMisses(options.earlyMisses);
  }

  handle(req: IncomingMessage, res: ServerResponse): Outcome {
    const target = req.url ?? '';
    const head = req.method === 'HEAD';
    const source = unwrapMapped(req.socket.remoteAddress ?? '');
    // IMDS's paths have guards of their own, per VM (imds-guards.ts).
    const imds = this.#imds.handle(req, res, target, source);
    if (imds !== undefined) return { status: imds, route: undefined, imds: true };
    const refusal = this.#screen.check(req, target, source);
    if (refusal !== undefined) {
      if (refusal.holdMs !== undefined) holdConnection(req, res, refusal.holdMs);
      send(res, refusal.status, refusal.body, head, refusal.headers);
      return { status: refusal.status, route: undefined };
    }
    // The redirect sidecar asking whether its DNAT target is this listener.
    const nonce = challengeNonce(target);
    if (nonce !== undefined) {
      send(res, 200, Buffer.from(`${this.#keyring.challengeAnswers(nonce).join('\n')}\n`), head);
      return { status: 200, route: undefined };
    }
    const route = parseDatasourcePath(target, this.#prefix);
    if (route === undefined) this.#identity.unrouted();
    const entry = route === undefined ? undefined : this.#identity.lookup(route, source);
    if (route?.kind === 'token' && entry === undefined)
      this.#early.missed(route.token, source, this.#clock.now(), this.#clock.monotonicMs());
    const bytes = entry === undefined || route === undefined ? undefined : this.#bytes.of(entry.seed, route.file);
    if (route === undefined || entry === undefined || bytes === undefined) {
      send(res, 404, NOT_FOUND_BODY, head);
      return { status: 404, route };
    }
    sendFile(res, route.file, bytes, head);
    if (!head) this.#served(entry, route);
    return { status: 200, route };
  }

  #served(entry: SeedDirectoryEntry, route: DatasourceRoute): void {
    const now = this.#clock.now();
    const missedAt = route.kind === 'token' ? this.#early.served(route.token, this.#clock.monotonicMs()) : undefined;
    try {
      this.#directory.recordFetch(entry.namespace, entry.name, route.file, now);
      if (missedAt !== undefined) this.#directory.recordSeededAfterBoot?.(entry, missedAt, now);
    } catch (e) {
      this.#logger.warn({ err: { message: (e as Error).message } }, 'recordFetch failed');
    }
    this.#logger.debug(
      { namespace: entry.namespace, name: entry.name, file: route.file, via: route.kind },
      'served seed file',
    );
  }
}

// The handler, with a failure answered as a bare 500 and every request
// counted and timed.
function measured(handler: SeedRequestHandler, logger: Logger, metrics: Metrics | undefined): RequestListener {
  return (req, res) => {
    const started = performance.now();
    let status = 500;
    let route: DatasourceRoute | undefined;
    let imds: true | undefined;
    try {
      ({ status, route, imds } = handler.handle(req, res));
    } catch (e) {
      // Never a stack trace or message to the client; the log gets the
      // message only (it cannot contain seed bytes: nothing here parses them).
      logger.error({ err: { message: (e as Error)?.message } }, 'datasource request failed');
      if (!res.headersSent) send(res, 500, INTERNAL_ERROR_BODY, req.method === 'HEAD', { Connection: 'close' });
      else res.destroy();
    }
    if (metrics) {
      const endpoint = endpointLabel(route, imds);
      metrics.datasourceRequests.inc({ endpoint, status: String(status) });
      metrics.datasourceRequestDuration.observe({ endpoint }, (performance.now() - started) / 1000);
    }
  };
}

// Progress reports go to their own receiver, with budgets of their own:
// a guest's burst of events must not spend the bucket its seed fetches use.
function withReports(
  seeds: RequestListener,
  options: DatasourceServerOptions,
  prefix: string,
  logger: Logger,
): RequestListener {
  if (!options.reports) return seeds;
  const clock = options.clock ?? SYSTEM_CLOCK;
  const receiver = new ReportReceiver({
    prefix,
    directory: options.directory,
    keyring: options.keyring,
    sink: options.reports.sink,
    logger,
    ...(options.metrics ? { metrics: options.metrics } : {}),
    ...(options.reports.limits ? { limits: options.reports.limits } : {}),
    now: clock.now,
    monotonicMs: clock.monotonicMs,
  });
  return (req, res) => {
    const token = receiver.claims(req.url ?? '');
    if (token === undefined) return seeds(req, res);
    receiver.handle(req, res, token, unwrapMapped(req.socket.remoteAddress ?? ''));
  };
}

// Every path, the reports' and the redirect's challenge included, refuses a
// request that says it was forwarded (forwarded.ts), before anything else.
function refusingForwarded(next: RequestListener, logger: Logger, metrics: Metrics | undefined): RequestListener {
  const throttle = new LogThrottle<ForwardingHeader>();
  for (const reason of FORWARDING_HEADERS) metrics?.datasourceForwardedRefused.inc({ reason }, 0);
  return (req, res) => {
    const reason = forwardingHeader(req);
    if (reason === undefined) return next(req, res);
    refuseForwarded(req, res);
    metrics?.datasourceForwardedRefused.inc({ reason });
    metrics?.datasourceRequests.inc({ endpoint: 'other', status: '400' });
    const admitted = throttle.admit(reason, performance.now());
    if (admitted !== undefined)
      logger.warn(
        { reason, source: unwrapMapped(req.socket.remoteAddress ?? ''), ...admitted },
        'forwarded request refused (logged at most once a minute per header)',
      );
  };
}

/**
 * Starts the datasource listener (NoCloud files, IMDS endpoints, and the
 * progress-report receiver when `reports` is set). Rejects with RangeError
 * for a bad prefix, or with the listen error itself (EADDRINUSE, EACCES).
 */
export async function startDatasourceServer(options: DatasourceServerOptions): Promise<DatasourceServer> {
  const logger = options.logger.child({ component: 'datasource' });
  const prefix = normalisePrefix(options.prefix ?? '/v1');
  const handler = new SeedRequestHandler(options, prefix, options.clock ?? SYSTEM_CLOCK, logger);
  const handle = refusingForwarded(
    withReports(measured(handler, logger, options.metrics), options, prefix, logger),
    logger,
    options.metrics,
  );
  // Every request counted on its connection first: a session PUT must open its own.
  const server = createDatasourceListener(options.limits ?? {}, options.metrics, (req, res) => {
    noteRequest(req);
    handle(req, res);
  });
  await listen(server, options.listen.port, options.listen.host);
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
