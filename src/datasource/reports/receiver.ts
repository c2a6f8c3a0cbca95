// The datasource listener's one POST: cloud-init's progress events, sent by
// its webhook reporting handler to `<prefix>/<report token>/cloud-init-events`
// (src/datasource/reports/report-token.ts), one JSON event per request.
//
// The sender is a guest, so every budget is checked before the work it
// guards: the method and path; the source's bucket (before any HMAC); the
// token (a miss costs what a hit does); the VMI's own bucket, then the
// node's (a flooding VM empties its own bucket, not the one the others
// share); the body's announced size and type; the bodies read at once for
// the VMI, then for the node; the body's real size and its deadline while it
// is read. A refused request gets a fixed body
// that repeats nothing it sent, is counted by reason, and logged at most
// once a minute per reason.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { Metrics } from '../../metrics/metrics.ts';
import { LogThrottle } from '../../core/log-throttle.ts';
import { readBoundedBody, type BodyRefusal } from '../../core/bounded-body.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../types.ts';
import { TokenIndex } from '../identity.ts';
import { TOKEN_LENGTH, isTokenShaped, type DatasourceKeyring } from '../tokens.ts';
import { RateLimiter } from '../flood/rate-limit.ts';
import { parseReportedEvent, type ReportedEvent } from './event.ts';
import { REPORT_PATH_NAME, reportMessage } from './report-token.ts';

/** Where verified events go (the agent's provisioning tracker). */
export interface ProgressSink {
  // False when the VMI is not tracked any more (deleted meanwhile).
  report(entry: SeedDirectoryEntry, event: ReportedEvent, at: Date): boolean;
}

/** Overrides of REPORT_LIMITS; rates are per second. */
export interface ReportLimits {
  // Body bytes (413 beyond). cloud-init's events are 150-400 bytes.
  maxBodyBytes?: number;
  // Per VMI (by token): a boot posts 100-200 events in bursts of tens per
  // second (modules with nothing to do finish in a millisecond).
  perVmRatePerSecond?: number;
  perVmBurst?: number;
  // Per source address, before the token is checked.
  perSourceRatePerSecond?: number;
  perSourceBurst?: number;
  // The whole node.
  globalRatePerSecond?: number;
  globalBurst?: number;
  // Bodies being read at once on the node (503 beyond).
  maxInFlight?: number;
  // Bodies being read at once for one VMI (503 beyond). The token is in the
  // path, so the VMI is known before a body byte is read: a request whose
  // token names no VMI is refused unread and takes no slot. cloud-init's
  // webhook handler posts one event at a time.
  perVmInFlight?: number;
  // How long a body may take to arrive, from its head (408 beyond): an
  // event is one small write, so a body still coming after this is being
  // dripped to hold a slot.
  bodyDeadlineMs?: number;
}

export const REPORT_LIMITS: Required<ReportLimits> = {
  maxBodyBytes: 16 * 1024,
  perVmRatePerSecond: 10,
  perVmBurst: 300,
  perSourceRatePerSecond: 100,
  perSourceBurst: 1000,
  globalRatePerSecond: 1000,
  globalBurst: 4000,
  maxInFlight: 64,
  perVmInFlight: 4,
  bodyDeadlineMs: 2_000,
};

export const REPORT_REFUSALS = [
  'method',
  'source-rate',
  'token',
  'vm-rate',
  'global-rate',
  'vm-busy',
  'busy',
  'too-large',
  'content-type',
  'aborted',
  'slow',
  'invalid-json',
  'invalid-event',
  'gone',
] as const;
export type ReportRefusal = (typeof REPORT_REFUSALS)[number];

interface Answer {
  status: number;
  body: Buffer;
  headers?: Record<string, string>;
}

const NOT_FOUND: Answer = { status: 404, body: Buffer.from('not found\n') };
const ANSWERS: Record<ReportRefusal, Answer> = {
  method: { status: 405, body: Buffer.from('method not allowed\n'), headers: { Allow: 'POST', Connection: 'close' } },
  'source-rate': { status: 429, body: Buffer.from('too many requests\n'), headers: { 'Retry-After': '1' } },
  token: NOT_FOUND,
  gone: NOT_FOUND,
  'vm-rate': { status: 429, body: Buffer.from('too many requests\n'), headers: { 'Retry-After': '1' } },
  'global-rate': { status: 429, body: Buffer.from('too many requests\n'), headers: { 'Retry-After': '1' } },
  'vm-busy': { status: 503, body: Buffer.from('busy\n'), headers: { 'Retry-After': '1', Connection: 'close' } },
  busy: { status: 503, body: Buffer.from('busy\n'), headers: { 'Retry-After': '1', Connection: 'close' } },
  'too-large': { status: 413, body: Buffer.from('request body too large\n'), headers: { Connection: 'close' } },
  'content-type': { status: 415, body: Buffer.from('body must be JSON\n'), headers: { Connection: 'close' } },
  slow: { status: 408, body: Buffer.from('request body too slow\n'), headers: { Connection: 'close' } },
  aborted: { status: 400, body: Buffer.from('request body incomplete\n'), headers: { Connection: 'close' } },
  'invalid-json': { status: 400, body: Buffer.from('body is not JSON\n') },
  'invalid-event': { status: 400, body: Buffer.from('body is not a cloud-init reporting event\n') },
};
const ACCEPTED: Answer = { status: 200, body: Buffer.from('ok\n') };

// cloud-init sends no Content-Type (requests sets none for a str body);
// anything that says it is not JSON is refused before it is read.
function acceptableType(value: string | undefined): boolean {
  if (value === undefined) return true;
  const type = value.split(';')[0].trim().toLowerCase();
  return type === 'application/json' || type === 'text/plain' || type === '';
}

function send(res: ServerResponse, a: Answer): void {
  res.writeHead(a.status, {
    'Cache-Control': 'no-store',
    'X-Content-Type-Options': 'nosniff',
    'Content-Type': 'text/plain; charset=utf-8',
    'Content-Length': String(a.body.byteLength),
    ...a.headers,
  });
  res.end(a.body);
}

export interface ReportReceiverOptions {
  prefix: string;
  directory: SeedDirectory;
  keyring: DatasourceKeyring;
  sink: ProgressSink;
  logger: Logger;
  metrics?: Metrics;
  limits?: ReportLimits;
  now?: () => Date;
  // Monotonic milliseconds, for the buckets.
  monotonicMs?: () => number;
}

/**
 * The datasource's progress-report endpoint. The server asks claims() for
 * each request target and hands the ones it claims to handle(), which
 * answers the request itself, refusals included.
 */
export class ReportReceiver {
  readonly #o: ReportReceiverOptions;
  readonly #limits: Required<ReportLimits>;
  readonly #index: TokenIndex;
  readonly #perSource: RateLimiter;
  readonly #perVm: RateLimiter;
  readonly #global: RateLimiter;
  readonly #logThrottle = new LogThrottle<ReportRefusal>();
  #inFlight = 0;
  // Bodies being read per VMI uid; a uid with none is not kept.
  readonly #inFlightPerVm = new Map<string, number>();

  constructor(options: ReportReceiverOptions) {
    this.#o = options;
    const l = (this.#limits = { ...REPORT_LIMITS, ...options.limits });
    const now = options.monotonicMs ?? (() => performance.now());
    this.#index = new TokenIndex(options.directory, options.keyring, {
      messagesOf: (uid) => [reportMessage(uid)],
      serials: false,
    });
    this.#perSource = new RateLimiter({ ratePerSecond: l.perSourceRatePerSecond, burst: l.perSourceBurst, now });
    this.#perVm = new RateLimiter({ ratePerSecond: l.perVmRatePerSecond, burst: l.perVmBurst, now });
    this.#global = new RateLimiter({ ratePerSecond: l.globalRatePerSecond, burst: l.globalBurst, maxKeys: 1, now });
    for (const reason of REPORT_REFUSALS) options.metrics?.provisioningReportsRefused.inc({ reason }, 0);
  }

  // The token in `<prefix>/<token>/cloud-init-events`, or undefined when the
  // target is not that path (then the request is the seed server's).
  claims(target: string): string | undefined {
    const p = this.#o.prefix;
    const tail = `/${REPORT_PATH_NAME}`;
    if (target.length !== p.length + 1 + TOKEN_LENGTH + tail.length) return undefined;
    if (!target.startsWith(`${p}/`) || !target.endsWith(tail)) return undefined;
    const token = target.slice(p.length + 1, p.length + 1 + TOKEN_LENGTH);
    return isTokenShaped(token) ? token : undefined;
  }

  handle(req: IncomingMessage, res: ServerResponse, token: string, source: string): void {
    let refusal: ReportRefusal | SeedDirectoryEntry;
    try {
      refusal = this.#screen(req, token, source);
    } catch (e) {
      this.#o.logger.error({ err: { message: (e as Error).message } }, 'progress report failed');
      send(res, { status: 500, body: Buffer.from('internal error\n'), headers: { Connection: 'close' } });
      return;
    }
    if (typeof refusal === 'string') return this.#refuse(req, res, refusal, source);
    const entry = refusal;
    const release = this.#takeSlot(entry.uid);
    let late = false;
    // The slot is given back at the deadline, not when the dripping client
    // lets go: the connection is cut once the 408 is out.
    const deadline = setTimeout(() => {
      late = true;
      release();
      this.#refuse(req, res, 'slow', source, entry);
    }, this.#limits.bodyDeadlineMs);
    void readBoundedBody(req, this.#limits.maxBodyBytes)
      .then((body) => {
        clearTimeout(deadline);
        if (!late) this.#accept(req, res, entry, body, source);
      })
      .finally(release);
  }

  // One body slot of the node's and of the VMI's; the function gives both
  // back, once however often it is called.
  #takeSlot(uid: string): () => void {
    this.#inFlight++;
    this.#inFlightPerVm.set(uid, (this.#inFlightPerVm.get(uid) ?? 0) + 1);
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.#inFlight--;
      const left = (this.#inFlightPerVm.get(uid) ?? 1) - 1;
      if (left <= 0) this.#inFlightPerVm.delete(uid);
      else this.#inFlightPerVm.set(uid, left);
    };
  }

  // A refusal, or the VMI the request may report for.
  #screen(req: IncomingMessage, token: string, source: string): ReportRefusal | SeedDirectoryEntry {
    if (req.method !== 'POST') return 'method';
    if (!this.#perSource.take(source)) return 'source-rate';
    const entry = this.#resolve(token, source);
    if (entry === undefined) return 'token';
    if (!this.#perVm.take(entry.uid)) return 'vm-rate';
    if (!this.#global.take('')) return 'global-rate';
    const cl = req.headers['content-length'];
    if (cl !== undefined && !(/^\d{1,9}$/.test(cl) && Number(cl) <= this.#limits.maxBodyBytes)) return 'too-large';
    if (!acceptableType(req.headers['content-type'])) return 'content-type';
    if ((this.#inFlightPerVm.get(entry.uid) ?? 0) >= this.#limits.perVmInFlight) return 'vm-busy';
    if (this.#inFlight >= this.#limits.maxInFlight) return 'busy';
    return entry;
  }

  // The same work for a miss as for a hit (TokenIndex.verified), and no
  // HMAC: the index holds the report tokens the keys in force accept (never
  // a serial's token). Where launcher pods are known, only from the VMI's
  // launcher address.
  #resolve(token: string, source: string): SeedDirectoryEntry | undefined {
    return this.#index.open(token, source);
  }

  #accept(
    req: IncomingMessage,
    res: ServerResponse,
    entry: SeedDirectoryEntry,
    body: Buffer | BodyRefusal,
    source: string,
  ): void {
    if (typeof body === 'string') return this.#refuse(req, res, body, source, entry);
    const parsed = parseReportedEvent(body.toString('utf8'));
    if (!parsed.ok) return this.#refuse(req, res, parsed.reason, source, entry);
    let kept: boolean;
    try {
      kept = this.#o.sink.report(entry, parsed.event, this.#o.now?.() ?? new Date());
    } catch (e) {
      this.#o.logger.error({ err: { message: (e as Error).message } }, 'recording a progress event failed');
      kept = false;
    }
    if (!kept) return this.#refuse(req, res, 'gone', source, entry);
    this.#o.metrics?.provisioningReports.inc();
    send(res, ACCEPTED);
  }

  #refuse(
    req: IncomingMessage,
    res: ServerResponse,
    reason: ReportRefusal,
    source: string,
    entry?: SeedDirectoryEntry,
  ): void {
    this.#o.metrics?.provisioningReportsRefused.inc({ reason });
    this.#log(reason, source, entry);
    if (res.writableEnded || res.destroyed) return;
    send(res, ANSWERS[reason]);
    // A body not read (refused before reading, or cut at the size bound)
    // is not waited for: the connection goes once the answer is out.
    if (!req.complete) res.once('finish', () => req.destroy());
  }

  #log(reason: ReportRefusal, source: string, entry: SeedDirectoryEntry | undefined): void {
    const admitted = this.#logThrottle.admit(reason, this.#o.monotonicMs?.() ?? performance.now());
    if (admitted === undefined) return;
    this.#o.logger.warn(
      {
        reason,
        source,
        ...(entry ? { namespace: entry.namespace, name: entry.name } : {}),
        ...admitted,
      },
      'progress report refused (logged at most once a minute per reason)',
    );
  }
}
