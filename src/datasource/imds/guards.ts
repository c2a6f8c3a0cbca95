// KubeVirt IMDS's request guards (internal/imds/server.go), kept per VM on a
// listener every VM of the node shares:
//  - a token bucket per VM (IMDS: 100/s, burst 100, one limiter per sidecar,
//    that is per VM), keyed by the VMI the request resolves to, so one VM's
//    flood never empties another's bucket; requests that resolve to no VMI
//    share a bucket per source address; a node-wide bucket behind both
//    bounds the total, and only requests a VM's own bucket let through
//    reach it, so a flooding VM is refused by its bucket, not the node's;
//  - `Metadata: true` on every path but the ones cloud-init and
//    cloudbase-init fetch without custom headers (IMDS exempts its NoCloud
//    and OpenStack paths): an SSRF guard, as on Azure;
//  - 1 KiB of header fields (IMDS: MaxHeaderBytes 1 KiB), GET/HEAD only
//    (PUT only for the session, session-endpoint.ts), no body.
// Unlike IMDS, the rate limit comes first: a flood without the header
// costs its sender its own bucket too.
import type { IncomingMessage } from 'node:http';
import { RateLimiter } from '../flood/rate-limit.ts';
import { imdsError, type ImdsReply } from './identity-endpoint.ts';
import type { ImdsFamily } from './imds-paths.ts';

/** Overrides of IMDS_GUARD_DEFAULTS; rates are per second. */
export interface ImdsGuardLimits {
  // Per VM (IMDS: 100 and 100).
  ratePerSecond?: number;
  burst?: number;
  // Every IMDS request of the node together.
  nodeRatePerSecond?: number;
  nodeBurst?: number;
  // Header field bytes (names, values, ": " and CRLF) per request.
  maxHeaderBytes?: number;
  maxTrackedVms?: number;
}

export const IMDS_GUARD_DEFAULTS = {
  ratePerSecond: 100,
  burst: 100,
  nodeRatePerSecond: 5_000,
  nodeBurst: 5_000,
  maxHeaderBytes: 1024,
  maxTrackedVms: 10_000,
} as const;

export type Throttle = 'vm' | 'source' | 'node';

const text = (status: number, body: string, headers: Record<string, string> = {}): ImdsReply => ({
  status,
  body: Buffer.from(body),
  headers: { 'Content-Type': 'text/plain; charset=utf-8', ...headers },
});

// How long a VM its bucket refused is told to wait (IMDS: `Retry-After: 1`);
// its connection is not read before then (connection-hold.ts).
export const RETRY_AFTER_MS = 1000;

// IMDS's answers, byte for byte where IMDS has one (Go's http.Error).
const TOO_MANY = text(429, 'rate limit exceeded\n', { 'Retry-After': String(RETRY_AFTER_MS / 1000) });
const BAD_METHOD = text(405, 'Method not allowed\n', { Allow: 'GET, HEAD' });
// PUT <prefix>/session (session-endpoint.ts) takes PUT only.
const BAD_SESSION_METHOD = text(405, 'Method not allowed\n', { Allow: 'PUT' });
const HEADERS_TOO_LARGE = text(431, 'request header fields too large\n', { Connection: 'close' });
const HAS_BODY = text(400, 'request body not accepted\n', { Connection: 'close' });
const NO_METADATA_HEADER = imdsError(400, 'missing_header', 'Metadata: true header is required');

export function headerBytes(req: IncomingMessage): number {
  let n = 0;
  const raw = req.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) n += raw[i].length + raw[i + 1].length + 4;
  return n;
}

export class ImdsGuards {
  readonly #perVm: RateLimiter;
  readonly #perSource: RateLimiter;
  readonly #node: RateLimiter;
  readonly #maxHeaderBytes: number;

  constructor(limits: ImdsGuardLimits = {}, now?: () => number) {
    const l = { ...IMDS_GUARD_DEFAULTS, ...limits };
    const clock = now ? { now } : {};
    this.#perVm = new RateLimiter({
      ratePerSecond: l.ratePerSecond,
      burst: l.burst,
      maxKeys: l.maxTrackedVms,
      ...clock,
    });
    this.#perSource = new RateLimiter({
      ratePerSecond: l.ratePerSecond,
      burst: l.burst,
      maxKeys: l.maxTrackedVms,
      ...clock,
    });
    this.#node = new RateLimiter({ ratePerSecond: l.nodeRatePerSecond, burst: l.nodeBurst, maxKeys: 1, ...clock });
    this.#maxHeaderBytes = l.maxHeaderBytes;
  }

  // Which bucket refused the request, or undefined. `vm` is the VMI UID the
  // request resolved to; undefined: the source address's bucket is used.
  throttle(vm: string | undefined, source: string): Throttle | undefined {
    if (vm !== undefined ? !this.#perVm.take(vm) : !this.#perSource.take(source)) return vm ? 'vm' : 'source';
    return this.#node.take('node') ? undefined : 'node';
  }

  static readonly tooMany = TOO_MANY;

  // The refusal for a request that passed the rate limit, or undefined.
  check(req: IncomingMessage, family: ImdsFamily): ImdsReply | undefined {
    if (headerBytes(req) > this.#maxHeaderBytes) return HEADERS_TOO_LARGE;
    const session = family === 'session';
    if (session ? req.method !== 'PUT' : req.method !== 'GET' && req.method !== 'HEAD')
      return session ? BAD_SESSION_METHOD : BAD_METHOD;
    const cl = req.headers['content-length'];
    if (req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0')) return HAS_BODY;
    // Node joins repeated unknown headers with ", ": only one exact `true` passes.
    // The session PUT has its own custom header instead (session-endpoint.ts).
    if (family !== 'openstack' && !session && req.headers.metadata !== 'true') return NO_METADATA_HEADER;
    return undefined;
  }
}
