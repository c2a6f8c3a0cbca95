// A small JSON client for the few Kubernetes calls the agent makes (list
// VMIs, get Secret/ConfigMap, create/patch Event) over the connection's
// server, TLS, credentials and keep-alive pool.
import { fetch } from 'undici';
import { VmseedError } from '../errors.ts';
import type { KubeConnection } from './kube-connection.ts';

export interface KubeResponse {
  status: number;
  body: unknown;
}

export interface KubeApi {
  request(method: 'GET' | 'POST' | 'PATCH' | 'PUT', path: string, body?: unknown, contentType?: string): Promise<KubeResponse>;
}

export class KubeConnectionApi implements KubeApi {
  readonly #conn: KubeConnection;
  readonly #timeoutMs: number;

  constructor(conn: KubeConnection, options: { timeoutMs?: number } = {}) {
    this.#conn = conn;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  async request(method: 'GET' | 'POST' | 'PATCH' | 'PUT', path: string, body?: unknown, contentType = 'application/json'): Promise<KubeResponse> {
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
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
    } catch (e) {
      throw new VmseedError('KUBE_API_UNAVAILABLE', `Kubernetes API server unreachable (${method} ${path.split('?')[0]}): ${transportReason(e)}; will retry`, {
        kind: 'retryable',
        cause: e,
      });
    }
    const text = await res.text();
    let parsed: unknown = undefined;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    return { status: res.status, body: parsed };
  }
}

// 5xx and 429 are the server's trouble and pass; the rest are ours.
export function statusError(method: string, path: string, status: number): VmseedError {
  const retryable = status >= 500 || status === 429;
  return new VmseedError(
    retryable ? 'KUBE_API_UNAVAILABLE' : 'KUBE_API_ERROR',
    `Kubernetes API answered ${status} to ${method} ${path.split('?')[0]}${status === 403 ? '; check the agent ClusterRole' : ''}`,
    { kind: retryable || status === 403 ? 'retryable' : 'terminal' },
  );
}

// The transport's own reason (ECONNREFUSED, TimeoutError...), never a body.
function transportReason(e: unknown): string {
  const err = e as { name?: string; code?: string; message?: string; cause?: { code?: string; message?: string } };
  return (err.cause?.code ?? err.code ?? (err.name === 'TimeoutError' ? 'timeout' : err.cause?.message ?? err.message ?? 'error')).slice(0, 120);
}
