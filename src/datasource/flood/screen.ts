// The checks a datasource request passes before anyone looks at its path:
// the per-source rate limit, the target's length, the method, and no body.
import type { IncomingMessage } from 'node:http';
import { RateLimiter } from './rate-limit.ts';

export interface Refusal {
  status: number;
  body: Buffer;
  headers: Record<string, string>;
  // Not read again on this connection for so long (connection-hold.ts).
  holdMs?: number;
}

export interface ScreenLimits {
  maxUrlLength: number;
  ratePerSecond: number;
  burst: number;
  maxTrackedSources: number;
  // Monotonic milliseconds.
  now: () => number;
}

// The client is told to wait so long, and its connection is not read before then.
const RETRY_AFTER_MS = 1000;
const TOO_MANY: Refusal = {
  status: 429,
  body: Buffer.from('too many requests\n'),
  headers: { 'Retry-After': String(RETRY_AFTER_MS / 1000) },
  holdMs: RETRY_AFTER_MS,
};
const TOO_LONG: Refusal = {
  status: 414,
  body: Buffer.from('request target too long\n'),
  headers: { Connection: 'close' },
};
const BAD_METHOD: Refusal = {
  status: 405,
  body: Buffer.from('method not allowed\n'),
  headers: { Allow: 'GET, HEAD', Connection: 'close' },
};
const HAS_BODY: Refusal = {
  status: 400,
  body: Buffer.from('request body not accepted\n'),
  headers: { Connection: 'close' },
};

/**
 * The server's first check on every datasource request: check() answers the
 * refusal to send (429 with a connection hold, 414, 405 or 400), or undefined.
 */
export class RequestScreen {
  readonly #limiter: RateLimiter;
  readonly #maxUrlLength: number;

  constructor(limits: ScreenLimits) {
    this.#maxUrlLength = limits.maxUrlLength;
    this.#limiter = new RateLimiter({
      ratePerSecond: limits.ratePerSecond,
      burst: limits.burst,
      maxKeys: limits.maxTrackedSources,
      now: limits.now,
    });
  }

  // The refusal to send, or undefined when the request may be answered.
  // Takes a token from the source's bucket.
  check(req: IncomingMessage, target: string, source: string): Refusal | undefined {
    if (!this.#limiter.take(source)) return TOO_MANY;
    if (target.length > this.#maxUrlLength) return TOO_LONG;
    if (req.method !== 'GET' && req.method !== 'HEAD') return BAD_METHOD;
    // No body on a seed request: anything announcing one is refused and the
    // connection closed, so we never read it.
    const cl = req.headers['content-length'];
    if (req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0')) return HAS_BODY;
    return undefined;
  }
}
