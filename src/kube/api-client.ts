// A small JSON client for the few Kubernetes calls the agent makes (list
// VMIs, get Secret/ConfigMap, create/patch Event, unpause) over the
// connection's server, TLS, credentials and keep-alive pool.
//
// The API server sheds load with 429 and a Retry-After (priority and
// fairness), and answers 5xx while it or etcd is in trouble: those are
// retried here, a few times, honouring Retry-After up to a cap, before the
// caller sees the status. A 401 makes the connection re-read its token file
// (a rotated service-account token) and the call is tried once more.
import { fetch } from 'undici';
import { VmseedError, cancelledBy } from '../errors.ts';
import type { KubeConnection } from './connection.ts';

/** The HTTP methods the agent's Kubernetes calls use. */
export type KubeMethod = 'GET' | 'POST' | 'PATCH' | 'PUT';

/**
 * An API server answer: any status comes back here (request() throws only
 * for transport failures and cancellation); `body` is the parsed JSON, or
 * undefined when it was empty or not JSON.
 */
export interface KubeResponse {
  status: number;
  body: unknown;
  // From a Retry-After header, in milliseconds.
  retryAfterMs?: number;
}

/**
 * The Kubernetes calls the agent makes, as a path and a JSON body. What the
 * agent's parts take, so tests hand them a fake API server.
 */
export interface KubeApi {
  // `signal`: the caller's own end (a reconcile's), besides the client's
  // stop signal; aborted, the call and its retries end with CANCELLED.
  request(
    method: KubeMethod,
    path: string,
    body?: unknown,
    contentType?: string,
    signal?: AbortSignal,
  ): Promise<KubeResponse>;
}

/** How KubeConnectionApi retries a 429 or 5xx before the caller sees it. */
export interface KubeRetryPolicy {
  // Further attempts after a 429 or 5xx (0: none).
  retries: number;
  // Without Retry-After: baseMs * 2^(n-1), at most maxMs.
  baseMs: number;
  maxMs: number;
  // Retry-After is honoured up to this; a longer one is cut to it.
  maxRetryAfterMs: number;
}

/** Three retries, 250 ms doubling to 2 s, Retry-After honoured up to 5 s. */
export const DEFAULT_RETRY: KubeRetryPolicy = { retries: 3, baseMs: 250, maxMs: 2000, maxRetryAfterMs: 5000 };

/** The statuses retried before the caller sees them: 429 and 500–504. */
export function isRetryableStatus(status: number): boolean {
  return status === 429 || (status >= 500 && status <= 504);
}

/**
 * KubeApi over a KubeConnection (see the module comment for retries and the
 * 401 re-read). request() throws VmseedError KUBE_API_UNAVAILABLE (retryable)
 * when the server cannot be reached or the call times out (default 30 s),
 * CANCELLED when its signal or the agent's stop aborts.
 */
export class KubeConnectionApi implements KubeApi {
  readonly #conn: KubeConnection;
  readonly #timeoutMs: number;
  readonly #retry: KubeRetryPolicy;
  readonly #sleep: (ms: number) => Promise<void>;
  readonly #cancel: AbortSignal | undefined;

  // `cancel`: the agent's stop signal; a call in flight when it aborts fails
  // at once with CANCELLED instead of waiting out timeoutMs.
  constructor(
    conn: KubeConnection,
    options: {
      timeoutMs?: number;
      retry?: Partial<KubeRetryPolicy>;
      sleep?: (ms: number) => Promise<void>;
      cancel?: AbortSignal;
    } = {},
  ) {
    this.#conn = conn;
    this.#cancel = options.cancel;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#retry = { ...DEFAULT_RETRY, ...options.retry };
    this.#sleep = options.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
  }

  async request(
    method: KubeMethod,
    path: string,
    body?: unknown,
    contentType = 'application/json',
    signal?: AbortSignal,
  ): Promise<KubeResponse> {
    const cancel = signal && this.#cancel ? AbortSignal.any([signal, this.#cancel]) : (signal ?? this.#cancel);
    let reauthenticated = false;
    for (let attempt = 0; ; attempt++) {
      if (cancel?.aborted) throw cancelledBy(cancel, 'the Kubernetes API call');
      const res = await this.#once(method, path, body, contentType, cancel);
      if (res.status === 401 && !reauthenticated && this.#conn.tokenRejected()) {
        reauthenticated = true;
        attempt--;
        continue;
      }
      if (!isRetryableStatus(res.status) || attempt >= this.#retry.retries) return res;
      const backoff = Math.min(this.#retry.maxMs, this.#retry.baseMs * 2 ** attempt);
      await this.#sleep(
        res.retryAfterMs !== undefined ? Math.min(res.retryAfterMs, this.#retry.maxRetryAfterMs) : backoff,
      );
    }
  }

  async #once(
    method: KubeMethod,
    path: string,
    body: unknown,
    contentType: string,
    cancel: AbortSignal | undefined,
  ): Promise<KubeResponse> {
    const url = this.#conn.getCurrentCluster().server + path;
    let res;
    try {
      const headers: Record<string, string> = { ...this.#conn.authHeaders(), accept: 'application/json' };
      if (body !== undefined) headers['content-type'] = contentType;
      // One keep-alive pool (the connection's) for every call.
      res = await fetch(url, {
        method,
        headers,
        dispatcher: this.#conn.dispatcher,
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        signal: cancel
          ? AbortSignal.any([AbortSignal.timeout(this.#timeoutMs), cancel])
          : AbortSignal.timeout(this.#timeoutMs),
      });
    } catch (e) {
      if (cancel?.aborted) throw cancelledBy(cancel, 'the Kubernetes API call');
      throw new VmseedError(
        'KUBE_API_UNAVAILABLE',
        `Kubernetes API server unreachable (${method} ${path.split('?')[0]}): ${transportReason(e)}; will retry`,
        {
          kind: 'retryable',
          cause: e,
        },
      );
    }
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    const after = retryAfterMs(res.headers.get('retry-after'));
    return { status: res.status, body: parsed, ...(after !== undefined ? { retryAfterMs: after } : {}) };
  }
}

/**
 * Retry-After in milliseconds, from delay-seconds or an IMF-fixdate (RFC
 * 9110 10.2.3); undefined when absent or malformed, 0 for a past date.
 */
export function retryAfterMs(header: string | null | undefined, now = Date.now()): number | undefined {
  if (header === null || header === undefined || header.trim() === '') return undefined;
  const text = header.trim();
  if (/^\d{1,9}$/.test(text)) return Number(text) * 1000;
  if (!/^[A-Za-z]{3}, \d{2} [A-Za-z]{3} \d{4} \d{2}:\d{2}:\d{2} GMT$/.test(text)) return undefined; // IMF-fixdate only
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** A Status's message: any JSON a server put there, shown as String() shows it. */
export function statusMessage(body: unknown): string {
  return String((body as { message?: unknown } | null | undefined)?.message ?? '');
}

/**
 * The typed error for a status the caller cannot use: KUBE_API_THROTTLED,
 * KUBE_API_UNAVAILABLE, KUBE_API_UNAUTHORIZED and KUBE_API_FORBIDDEN are
 * retryable, any other status KUBE_API_ERROR (terminal). The API server's
 * Status message is quoted for 403 only: it names the user, verb, resource
 * and namespace RBAC refused, never object content.
 */
export function statusError(method: string, path: string, res: number | KubeResponse): VmseedError {
  const status = typeof res === 'number' ? res : res.status;
  const where = `${method} ${path.split('?')[0]}`;
  if (status === 429) {
    return new VmseedError(
      'KUBE_API_THROTTLED',
      `Kubernetes API server is shedding load (429 to ${where}, retried); will retry`,
      { kind: 'retryable' },
    );
  }
  if (status >= 500) {
    return new VmseedError(
      'KUBE_API_UNAVAILABLE',
      `Kubernetes API answered ${status} to ${where} (retried); will retry`,
      { kind: 'retryable' },
    );
  }
  if (status === 401) {
    return new VmseedError(
      'KUBE_API_UNAUTHORIZED',
      `Kubernetes API rejected the agent's credentials (401 to ${where}): the service-account token expired or was revoked, or the kubeconfig's is wrong; will retry`,
      { kind: 'retryable' },
    );
  }
  if (status === 403) {
    const message = typeof res === 'number' ? '' : statusMessage(res.body).slice(0, 300);
    return new VmseedError(
      'KUBE_API_FORBIDDEN',
      `Kubernetes API answered 403 to ${where}${message ? ` (${message})` : ''}; grant it in the agent's ClusterRole, or in the namespace's Role with --namespaces; will retry`,
      { kind: 'retryable' },
    );
  }
  return new VmseedError('KUBE_API_ERROR', `Kubernetes API answered ${status} to ${where}`, { kind: 'terminal' });
}

/**
 * The transport's own reason (ECONNREFUSED, TimeoutError...), never a body;
 * TLS verification failures are explained. At most 120 characters.
 */
export function transportReason(e: unknown): string {
  const err = e as { name?: string; code?: string; message?: string; cause?: { code?: string; message?: string } };
  const code = err.cause?.code ?? err.code;
  // OpenSSL's verify errors: the server is not who ca.crt / the kubeconfig's CA says.
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID')
    return `TLS: the server's certificate does not name the host connected to (${code})`;
  if (
    code &&
    /^(UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT(_LOCALLY)?|SELF_SIGNED_CERT_IN_CHAIN|DEPTH_ZERO_SELF_SIGNED_CERT|CERT_[A-Z_]+)$/.test(
      code,
    )
  ) {
    return `TLS: the server's certificate is not signed by the configured CA (${code}); check the service account's ca.crt or the kubeconfig's certificate-authority`;
  }
  return (code ?? (err.name === 'TimeoutError' ? 'timeout' : (err.cause?.message ?? err.message ?? 'error'))).slice(
    0,
    120,
  );
}
