// The 169.254.169.254 redirect as the agent sees it, for the status page:
// the `redirect` sidecar (src/redirect) keeps the DNAT and answers its own
// /readyz; the agent polls that endpoint so someone reading /status learns
// whether guests can reach the datasource at all. Not part of the agent's
// own /readyz: the sidecar's readiness already says so, and an agent that
// goes unready with it would also stop serving seeds that do not need it.
import type { RedirectStatus } from '../status/snapshot.ts';

// The sidecar's JSON is under 1.2 KiB; anything past this is not its answer.
export const RESPONSE_MAX = 4096;
export const REASON_MAX = 300;

export interface RedirectStatusPollerOptions {
  url: string;
  intervalMs?: number;
  timeoutMs?: number;
  now?: () => Date;
  fetch?: typeof fetch;
}

/**
 * Polls the redirect sidecar's /readyz (JSON) for the agent's status page;
 * `status` is undefined until the first poll has finished.
 */
export class RedirectStatusPoller {
  readonly #o: RedirectStatusPollerOptions;
  #status: RedirectStatus | undefined;
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = false;

  constructor(options: RedirectStatusPollerOptions) {
    this.#o = options;
  }

  // Undefined until the first poll has finished.
  get status(): RedirectStatus | undefined {
    return this.#status ? { ...this.#status } : undefined;
  }

  async poll(): Promise<RedirectStatus> {
    const seen = await observe(this.#o.url, this.#o.timeoutMs ?? 2000, this.#o.fetch ?? fetch);
    const at = (this.#o.now ? this.#o.now() : new Date()).toISOString();
    const prev = this.#status;
    // `since` is when the state last changed, not when the reason text did.
    const since = prev && prev.state === seen.state ? prev.since : at;
    this.#status = { state: seen.state, ...(seen.reason ? { reason: seen.reason } : {}), since, checkedAt: at };
    return { ...this.#status };
  }

  start(): void {
    const loop = () => {
      this.#running = this.poll()
        .then(
          () => {},
          () => {},
        )
        .finally(() => {
          if (!this.#stopped) this.#timer = setTimeout(loop, this.#o.intervalMs ?? 5000);
        });
    };
    loop();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    await this.#running;
  }
}

async function observe(
  url: string,
  timeoutMs: number,
  doFetch: typeof fetch,
): Promise<Pick<RedirectStatus, 'state' | 'reason'>> {
  const signal = AbortSignal.timeout(timeoutMs);
  let res: Response;
  let text: string;
  try {
    res = await doFetch(url, { signal, headers: { accept: 'application/json' }, redirect: 'manual' });
    text = await readBounded(res);
  } catch (e) {
    const cause = (e as { cause?: { code?: string } }).cause?.code;
    const name = (e as Error).name;
    return {
      state: 'unreachable',
      reason:
        name === 'TimeoutError' || name === 'AbortError'
          ? `no answer within ${timeoutMs} ms`
          : (cause ?? 'connection failed'),
    };
  }
  let body: { inPlace?: unknown; reason?: unknown; message?: unknown } | undefined;
  try {
    body = JSON.parse(text) as typeof body;
  } catch {
    body = undefined;
  }
  if (res.status === 200 && (body === undefined || body.inPlace !== false)) return { state: 'in-place' };
  if (res.status === 503 || body?.inPlace === false) {
    const parts = body ? [body.reason, body.message].filter((x) => typeof x === 'string') : [text.trim()];
    const state = body?.reason === 'wrong-target' ? 'elsewhere' : 'missing';
    return { state, reason: clip(parts.join(': ') || `HTTP ${res.status}`) };
  }
  // A 404 or 500: something answers there, but not the sidecar's /readyz.
  return { state: 'unreachable', reason: `HTTP ${res.status} from ${url}` };
}

// Reads at most RESPONSE_MAX bytes, then cancels the rest.
async function readBounded(res: Response): Promise<string> {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  try {
    while (total < RESPONSE_MAX) {
      const { done, value } = (await reader.read()) as
        { done: true; value?: undefined } | { done: false; value: Uint8Array };
      if (done) break;
      chunks.push(value.subarray(0, RESPONSE_MAX - total));
      total += Math.min(value.byteLength, RESPONSE_MAX - total);
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return Buffer.concat(chunks).toString('utf8');
}

// One line, printable, bounded: the page escapes it, this keeps it short.
function clip(s: string): string {
  const one = s.replace(/[\u0000-\u001f\u007f]+/g, ' ').trim();
  return one.length > REASON_MAX ? `${one.slice(0, REASON_MAX - 1)}…` : one;
}
