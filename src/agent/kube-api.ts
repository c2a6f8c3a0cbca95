// A small JSON client for the few Kubernetes calls the agent makes (list
// VMIs, get Secret/ConfigMap, create/patch Event), using the kubeconfig's
// server, TLS and credentials exactly as client-node's Watch does.
import { fetch } from 'undici';
import { HttpMethod, KubeConfig, RequestContext } from '@kubernetes/client-node';
import { VmseedError } from '../errors.ts';

export interface KubeResponse {
  status: number;
  body: unknown;
}

export interface KubeApi {
  request(method: 'GET' | 'POST' | 'PATCH', path: string, body?: unknown, contentType?: string): Promise<KubeResponse>;
}

export function loadKubeConfig(kubeconfig: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  if (kubeconfig) kc.loadFromFile(kubeconfig);
  else kc.loadFromCluster();
  return kc;
}

export class KubeConfigApi implements KubeApi {
  readonly #kc: KubeConfig;
  readonly #timeoutMs: number;
  // client-node builds a new undici Agent (connection pool) on every
  // applySecurityAuthentication: reusing the first keeps one pool of
  // keep-alive connections instead of a new TCP (and TLS) handshake and a
  // leaked pool per request. Auth headers are refreshed every few seconds
  // (token files rotate).
  #dispatcher: unknown;
  #headers: Record<string, string> | undefined;
  #headersAt = 0;

  constructor(kc: KubeConfig, options: { timeoutMs?: number } = {}) {
    this.#kc = kc;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  async request(method: 'GET' | 'POST' | 'PATCH', path: string, body?: unknown, contentType = 'application/json'): Promise<KubeResponse> {
    const cluster = this.#kc.getCurrentCluster();
    if (!cluster) throw new VmseedError('KUBE_API_ERROR', 'kubeconfig has no current cluster; check --kubeconfig', { kind: 'terminal' });
    const url = cluster.server + path;
    let res;
    try {
      const headers: Record<string, string> = { ...(await this.#auth(url)), accept: 'application/json' };
      if (body !== undefined) headers['content-type'] = contentType;
      res = await fetch(url, {
        method,
        headers,
        ...(this.#dispatcher ? { dispatcher: this.#dispatcher as never } : {}),
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

  async #auth(url: string): Promise<Record<string, string>> {
    if (this.#headers && Date.now() - this.#headersAt < HEADERS_TTL_MS) return { ...this.#headers };
    const ctx = new RequestContext(url, HttpMethod.GET);
    await this.#kc.applySecurityAuthentication(ctx);
    this.#dispatcher ??= ctx.getDispatcher();
    this.#headers = { ...(ctx.getHeaders() as Record<string, string>) };
    this.#headersAt = Date.now();
    return { ...this.#headers };
  }
}

const HEADERS_TTL_MS = 10_000;

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
