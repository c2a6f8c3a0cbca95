// The node-scoped object service: an HTTPS listener that speaks the
// Kubernetes API's wire protocol for the only requests a node agent makes of
// Secrets and ConfigMaps (object-watches.ts, resolver.ts, watch.ts):
//
//   GET /api/v1/namespaces/{ns}/{secrets|configmaps}/{name}
//   GET /api/v1/namespaces/{ns}/{secrets|configmaps}?watch=true&fieldSelector=metadata.name={name}
//       [&resourceVersion=…&allowWatchBookmarks=true&timeoutSeconds=…]
//   PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/unpause
//
// The unpause is the seed gate's (agent/domain/kubevirt-resume.ts). KubeVirt
// serves it through API aggregation (virt-api), where neither RBAC nor the
// API server's admission can name a node; so the node agents hold no right
// to it, and this service unpauses on a node's behalf only a VMI that runs
// on that node now (never a migration target's: the source still runs it).
//
// Each is authenticated (token-review.ts: the agent's pod-bound token names
// its node), authorized (references.ts: a VMI on that node in that
// namespace references the object), then forwarded to the API server with
// this component's own credential and the answer streamed back as it came.
// Anything else gets the API server's own refusals: 401 without a usable
// token, 403 for any other verb or resource (a list, a watch of more than
// one name), 404 outside the API's paths. So the node agents need no RBAC on
// Secrets and ConfigMaps: one node's credential reads only what its VMIs use,
// as the Node authorizer limits a kubelet to its pods' objects.
//
// A watch is checked again every `recheckMs` and ended (cleanly, as the API
// server ends one at its timeout) once the object is no longer referenced
// from that node: the agent's renewal is then refused.
import {
  createSecureServer,
  type Http2SecureServer,
  type Http2ServerRequest,
  type Http2ServerResponse,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { fetch } from 'undici';
import type { KubeApi } from '../../kube/api-client.ts';
import type { KubeConnection } from '../../kube/connection.ts';
import type { VendorDataRef } from '../../cloudinit/userdata/vendor-data.ts';
import { BoundedWatch } from '../../kube/watch.ts';
import { CertDir } from '../webhook/certs.ts';
import { NodeReferences, type ObjectKind } from './references.ts';
import { OBJECTS_AUDIENCE, TokenReviewer, type Identity } from './token-review.ts';

/** Per-node budgets of the object service. */
export interface ObjectServiceLimits {
  // Requests per second a node may make, on average (default 50: a node's
  // most watches, 512, renew every few minutes), and in a burst (default
  // 1,200: a cold start of a node with 512 referenced objects, a get and a
  // watch each, with room to spare).
  ratePerSecond?: number;
  burst?: number;
  // Watches one node may hold open at once.
  maxWatchesPerNode?: number;
  // Largest answer forwarded for a GET (a Secret is at most 1 MiB).
  maxObjectBytes?: number;
  maxConnections?: number;
}

/** What startObjectService needs. */
export interface ObjectServiceOptions {
  listen: { host: string; port: number };
  // tls.crt and tls.key, reloaded when they change; or the PEM pair itself.
  certDir?: string;
  tls?: { cert: string | Buffer; key: string | Buffer };
  // The cluster component's own API connection and client.
  connection: KubeConnection;
  api: KubeApi;
  logger: Logger;
  // The node agent's service account, `namespace:name`.
  agentServiceAccount: string;
  audience?: string;
  defaultVendorData?: VendorDataRef;
  limits?: ObjectServiceLimits;
  // How often an open watch is checked against the references (default 10 s).
  recheckMs?: number;
  // TokenReview result lifetime (default 10 s).
  tokenTtlMs?: number;
  // How long a request for an object no VMI of the node references waits for
  // the VMI cache to catch up before it is refused (default 1 s).
  refusalWaitMs?: number;
}

/** A running object service. */
export interface ObjectService {
  readonly address: AddressInfo;
  // Why it cannot serve (no certificate, VMIs not listed yet), or undefined.
  problem(): string | undefined;
  // Open watches per node (tests, status).
  watches(): Map<string, number>;
  // Puts a certificate into service (a self-issued one, renewed); new
  // connections use it.
  setCertificate(cert: string, key: string): void;
  close(): Promise<void>;
}

interface Route {
  kind: ObjectKind;
  resource: 'secrets' | 'configmaps';
  namespace: string;
  name: string;
  watch: boolean;
}

// A DNS subdomain (names) or label (namespaces): what the API server accepts.
const NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const UNPAUSE =
  /^\/apis\/subresources\.kubevirt\.io\/v1\/namespaces\/([^/]+)\/virtualmachineinstances\/([^/]+)\/unpause$/;

function statusBody(code: number, reason: string, message: string, details?: Record<string, unknown>): string {
  return JSON.stringify({
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(details ? { details } : {}),
    code,
  });
}

type Res = Http2ServerResponse;

// The API server's 403, with its wording in `message`.
function forbid(res: Res, message: string, details?: Record<string, unknown>): void {
  reply(res, 403, statusBody(403, 'Forbidden', message, details));
}

function reply(res: Res, code: number, body: string, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(code, {
    'content-type': 'application/json',
    'cache-control': 'no-store',
    'content-length': String(Buffer.byteLength(body)),
    ...headers,
  });
  res.end(body);
}

// The request as one of the two shapes served, or the refusal the API server would give.
function route(method: string, url: URL): Route | { code: 403 | 404; why: string; resource?: string } {
  const m = /^\/api\/v1\/namespaces\/([^/]+)\/(secrets|configmaps)(?:\/([^/]+))?$/.exec(url.pathname);
  if (!m) {
    if (/^\/apis?(\/|$)/.test(url.pathname)) return { code: 403, why: 'only Secrets and ConfigMaps are served' };
    return { code: 404, why: 'the server could not find the requested resource' };
  }
  const resource = m[2] as 'secrets' | 'configmaps';
  let namespace: string;
  let name: string | undefined;
  try {
    namespace = decodeURIComponent(m[1]);
    name = m[3] === undefined ? undefined : decodeURIComponent(m[3]);
  } catch {
    return { code: 404, why: 'the server could not find the requested resource' };
  }
  const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
  const verb = method !== 'GET' ? method.toLowerCase() : name ? 'get' : watch ? 'watch' : 'list';
  if (method !== 'GET') return { code: 403, why: verb, resource };
  if (name === undefined) {
    const selected = /^metadata\.name==?(.+)$/.exec(url.searchParams.get('fieldSelector') ?? '')?.[1];
    if (!watch || selected === undefined) return { code: 403, why: verb, resource };
    name = selected;
  } else if (watch) return { code: 403, why: 'watch', resource };
  if (!NAME.test(namespace) || namespace.length > 63 || !NAME.test(name))
    return { code: 404, why: 'the server could not find the requested resource' };
  return { kind: resource === 'secrets' ? 'Secret' : 'ConfigMap', resource, namespace, name, watch };
}

// Requests per node: a token bucket.
class Budget {
  #tokens: number;
  #at = Date.now();
  readonly #rate: number;
  readonly #burst: number;
  constructor(rate: number, burst: number) {
    this.#rate = rate;
    this.#burst = burst;
    this.#tokens = burst;
  }
  take(): boolean {
    const now = Date.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#at) / 1000) * this.#rate);
    this.#at = now;
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }
}

class Handler {
  readonly #o: ObjectServiceOptions;
  readonly #log: Logger;
  readonly #reviewer: TokenReviewer;
  readonly refs: NodeReferences;
  readonly #budgets = new Map<string, Budget>();
  readonly watches = new Map<string, number>();
  readonly #username: string;
  readonly #open = new Set<() => void>();

  constructor(options: ObjectServiceOptions, log: Logger) {
    this.#o = options;
    this.#log = log;
    const [ns, name] = options.agentServiceAccount.split(':');
    this.#username = `system:serviceaccount:${ns}:${name}`;
    this.#reviewer = new TokenReviewer({
      api: options.api,
      username: this.#username,
      ...(options.audience ? { audience: options.audience } : {}),
      ...(options.tokenTtlMs !== undefined ? { ttlMs: options.tokenTtlMs } : {}),
    });
    this.refs = new NodeReferences({
      api: options.api,
      watcher: new BoundedWatch({ connection: options.connection }),
      logger: log,
      ...(options.defaultVendorData ? { defaultVendorData: options.defaultVendorData } : {}),
    });
  }

  endAll(): void {
    for (const end of [...this.#open]) end();
  }

  async handle(req: Http2ServerRequest, res: Res): Promise<void> {
    const url = new URL(req.url ?? '/', 'https://objects');
    const auth = /^Bearer (\S+)$/.exec(String(req.headers.authorization ?? ''));
    const identity: Identity | undefined = auth
      ? await this.#reviewer.identify(auth[1])
      : { ok: false, status: 401, reason: 'no bearer token' };
    if (identity === undefined)
      return reply(res, 503, statusBody(503, 'ServiceUnavailable', 'tokens cannot be checked now'), {
        'retry-after': '1',
      });
    if (!identity.ok) {
      this.#log.debug({ reason: identity.reason }, 'object request refused: not authenticated');
      return identity.status === 401
        ? reply(res, 401, statusBody(401, 'Unauthorized', 'Unauthorized'))
        : reply(res, 403, statusBody(403, 'Forbidden', `forbidden: ${identity.reason}`));
    }
    const node = identity.node;
    const unpause = UNPAUSE.exec(url.pathname);
    if (unpause && req.method === 'PUT')
      return this.#unpause(req, res, node, identity.username, unpause[1], unpause[2]);
    const r = route(req.method ?? 'GET', url);
    if (!('kind' in r)) {
      if (r.code === 404) return reply(res, 404, statusBody(404, 'NotFound', r.why));
      const what = r.resource ? `${r.why} resource "${r.resource}"` : r.why;
      return forbid(
        res,
        `${r.resource ?? 'resource'} is forbidden: User "${identity.username}" cannot ${what}: node "${node}" may only get and watch single objects its VMIs reference`,
      );
    }
    if (!this.#spend(node, res)) return;
    if (!(await this.#allows(node, r))) {
      this.#log.info(
        { node, kind: r.kind, namespace: r.namespace, name: r.name },
        'object request refused: no VMI of the node references it',
      );
      return forbid(res, forbidden(identity.username, node, r), forbiddenDetails(r));
    }
    if (!r.watch) return this.#get(res, r);
    return this.#watch(req, res, r, node, url);
  }

  // A VMI the agent saw a moment before this component did (two watches of
  // the API server) is waited for a little, so the agent's first read of
  // its data is not refused.
  async #allows(node: string, r: Route): Promise<boolean> {
    const deadline = Date.now() + (this.#o.refusalWaitMs ?? 1000);
    for (;;) {
      if (await this.refs.allows(node, r.kind, r.namespace, r.name)) return true;
      if (Date.now() >= deadline) return false;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  async #unpause(
    req: Http2ServerRequest,
    res: Res,
    node: string,
    username: string,
    rawNamespace: string,
    rawName: string,
  ): Promise<void> {
    // The body is KubeVirt's empty options object: nothing of it is forwarded.
    req.resume();
    let namespace: string;
    let name: string;
    try {
      namespace = decodeURIComponent(rawNamespace);
      name = decodeURIComponent(rawName);
    } catch {
      return reply(res, 404, statusBody(404, 'NotFound', 'the server could not find the requested resource'));
    }
    if (!NAME.test(namespace) || namespace.length > 63 || !NAME.test(name))
      return reply(res, 404, statusBody(404, 'NotFound', 'the server could not find the requested resource'));
    if (!this.#spend(node, res)) return;
    const deadline = Date.now() + (this.#o.refusalWaitMs ?? 1000);
    while (!this.refs.runsOn(node, namespace, name)) {
      if (Date.now() >= deadline) {
        this.#log.info({ node, namespace, name }, 'unpause refused: the VMI does not run on the node');
        return forbid(
          res,
          `virtualmachineinstances.subresources.kubevirt.io "${name}" is forbidden: User "${username}" cannot update resource "virtualmachineinstances/unpause" in API group "subresources.kubevirt.io" in the namespace "${namespace}": the VMI does not run on node '${node}'`,
          { name, group: 'subresources.kubevirt.io', kind: 'virtualmachineinstances' },
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const path = `/apis/subresources.kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachineinstances/${encodeURIComponent(name)}/unpause`;
    let answer;
    try {
      answer = await this.#o.api.request('PUT', path, {});
    } catch {
      return reply(res, 503, statusBody(503, 'ServiceUnavailable', 'the API server cannot be reached'), {
        'retry-after': '1',
      });
    }
    this.#log.info({ node, namespace, name, status: answer.status }, 'unpaused on behalf of the node');
    reply(res, answer.status, typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body ?? {}));
  }

  // One request of the node's budget, or its 429 answered.
  #spend(node: string, res: Res): boolean {
    const budget = this.#budgets.get(node) ?? this.#budgets.set(node, this.#newBudget()).get(node)!;
    if (budget.take()) return true;
    reply(res, 429, statusBody(429, 'TooManyRequests', 'Too many requests, please try again later.'), {
      'retry-after': '1',
    });
    return false;
  }

  #newBudget(): Budget {
    const l = this.#o.limits ?? {};
    return new Budget(l.ratePerSecond ?? 50, l.burst ?? 1200);
  }

  async #get(res: Res, r: Route): Promise<void> {
    const path = `/api/v1/namespaces/${encodeURIComponent(r.namespace)}/${r.resource}/${encodeURIComponent(r.name)}`;
    let answer;
    try {
      answer = await this.#o.api.request('GET', path);
    } catch {
      return reply(res, 503, statusBody(503, 'ServiceUnavailable', 'the API server cannot be reached'), {
        'retry-after': '1',
      });
    }
    const body = JSON.stringify(answer.body ?? {});
    if (Buffer.byteLength(body) > (this.#o.limits?.maxObjectBytes ?? 4 * 1024 * 1024))
      return reply(res, 500, statusBody(500, 'InternalError', 'object larger than the service forwards'));
    reply(res, answer.status, body);
  }

  async #watch(req: Http2ServerRequest, res: Res, r: Route, node: string, url: URL): Promise<void> {
    const open = this.watches.get(node) ?? 0;
    if (open >= (this.#o.limits?.maxWatchesPerNode ?? 512))
      return reply(res, 429, statusBody(429, 'TooManyRequests', `node has ${open} watches open`), {
        'retry-after': '5',
      });
    const upstream = new URL(
      `${this.#o.connection.getCurrentCluster().server}/api/v1/namespaces/${encodeURIComponent(r.namespace)}/${r.resource}`,
    );
    upstream.searchParams.set('watch', 'true');
    upstream.searchParams.set('fieldSelector', `metadata.name=${r.name}`);
    const rv = url.searchParams.get('resourceVersion');
    if (rv !== null && /^\d{0,20}$/.test(rv)) upstream.searchParams.set('resourceVersion', rv);
    if (url.searchParams.get('allowWatchBookmarks') === 'true')
      upstream.searchParams.set('allowWatchBookmarks', 'true');
    const asked = Number(url.searchParams.get('timeoutSeconds') ?? 600);
    upstream.searchParams.set(
      'timeoutSeconds',
      String(Math.min(1800, Math.max(1, Number.isFinite(asked) ? Math.floor(asked) : 600))),
    );
    const controller = new AbortController();
    this.watches.set(node, open + 1);
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      clearInterval(recheck);
      this.#open.delete(end);
      controller.abort();
      const n = (this.watches.get(node) ?? 1) - 1;
      if (n > 0) this.watches.set(node, n);
      else this.watches.delete(node);
      if (!res.writableEnded) res.end();
    };
    this.#open.add(end);
    req.on('close', end);
    const recheck = setInterval(() => {
      void this.refs.allows(node, r.kind, r.namespace, r.name).then((ok) => {
        if (ok) return;
        this.#log.info(
          { node, kind: r.kind, namespace: r.namespace, name: r.name },
          'watch ended: no VMI of the node references the object any more',
        );
        end();
      });
    }, this.#o.recheckMs ?? 10_000);
    recheck.unref();
    let upstreamRes;
    try {
      upstreamRes = await fetch(upstream, {
        headers: { ...this.#o.connection.authHeaders(), accept: 'application/json' },
        dispatcher: this.#o.connection.dispatcher,
        signal: controller.signal,
      });
    } catch {
      if (!ended) reply(res, 503, statusBody(503, 'ServiceUnavailable', 'the API server cannot be reached'));
      end();
      return;
    }
    if (upstreamRes.status === 401) this.#o.connection.tokenRejected();
    if (ended) {
      await upstreamRes.body?.cancel().catch(() => undefined);
      return;
    }
    if (upstreamRes.status !== 200) {
      const text = await upstreamRes.text().catch(() => '');
      const retryAfter = upstreamRes.headers.get('retry-after');
      reply(res, upstreamRes.status, text.slice(0, 64 * 1024), retryAfter ? { 'retry-after': retryAfter } : {});
      end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' });
    // HTTP/1.1 would buffer the head until the first event.
    (res as unknown as { flushHeaders?: () => void }).flushHeaders?.();
    try {
      for await (const chunk of (upstreamRes.body ?? []) as AsyncIterable<Uint8Array>) {
        if (ended) break;
        if (!res.write(chunk))
          await new Promise<void>((resolve) => {
            res.once('drain', resolve);
            req.once('close', resolve);
          });
      }
    } catch {
      // The upstream stream broke or was aborted: the client sees the end
      // and renews from its resourceVersion.
    }
    end();
  }
}

function forbidden(username: string, node: string, r: Route): string {
  const verb = r.watch ? 'watch' : 'get';
  return `${r.resource} "${r.name}" is forbidden: User "${username}" cannot ${verb} resource "${r.resource}" in API group "" in the namespace "${r.namespace}": no relationship found between node '${node}' and this object`;
}

function forbiddenDetails(r: Route): Record<string, unknown> {
  return { name: r.name, kind: r.resource };
}

/**
 * Starts the object service's HTTPS listener and its VMI list/watch; resolves
 * once it listens (the VMI list may still be under way: requests before it
 * are refused as unreferenced). Rejects when it cannot listen.
 */
export async function startObjectService(options: ObjectServiceOptions): Promise<ObjectService> {
  const log = options.logger.child({ component: 'objects' });
  const handler = new Handler(options, log);
  const server: Http2SecureServer = createSecureServer({
    allowHTTP1: true,
    ...(options.tls ? { cert: options.tls.cert, key: options.tls.key } : {}),
    maxSessionMemory: 32,
    settings: { maxConcurrentStreams: 1000 },
    maxHeaderListPairs: 64,
  });
  server.setTimeout(0);
  server.maxConnections = options.limits?.maxConnections ?? 4096;
  server.on('request', (req: Http2ServerRequest, res: Http2ServerResponse) => {
    void handler.handle(req, res).catch((e: unknown) => {
      log.error({ err: { message: String((e as Error)?.message ?? e).slice(0, 200) } }, 'object request failed');
      if (!res.headersSent) reply(res, 500, statusBody(500, 'InternalError', 'internal error'));
      else res.end();
    });
  });
  server.on('tlsClientError', () => undefined);
  const sockets = new Set<TLSSocket>();
  server.on('secureConnection', (s: TLSSocket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  let certs: CertDir | undefined;
  let hasCert = options.tls !== undefined;
  if (options.certDir) {
    certs = new CertDir({
      dir: options.certDir,
      logger: log,
      onLoad: (pair) => {
        hasCert = true;
        server.setSecureContext({ cert: pair.cert, key: pair.key });
      },
    });
    await certs.check();
    certs.start();
  }
  void handler.refs.start();
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.listen.port, options.listen.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (e) {
    certs?.stop();
    await handler.refs.stop();
    throw e;
  }
  const address = server.address() as AddressInfo;
  log.info(
    { address: address.address, port: address.port, audience: options.audience ?? OBJECTS_AUDIENCE },
    'node-scoped object service listening',
  );
  return {
    address,
    problem: () =>
      certs?.problem() ??
      (!hasCert ? 'no certificate yet' : undefined) ??
      (handler.refs.synced ? undefined : 'VMIs not listed yet'),
    watches: () => new Map(handler.watches),
    setCertificate: (cert, key) => {
      server.setSecureContext({ cert, key });
      hasCert = true;
    },
    close: async () => {
      certs?.stop();
      await handler.refs.stop();
      handler.endAll();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        // Keep-alive and HTTP/2 connections stay open until they go: end them.
        for (const s of sockets) s.destroy();
      });
    },
  };
}
