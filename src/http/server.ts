// The agent's HTTP listeners: /metrics, /healthz, /readyz (probes, on the
// pod network) and /status, /status.json, /status/<namespace>/<name> (every
// tenant's VMI names, paths and errors: loopback by default in cluster
// mode), on one listener or two. node:http only. Rendering lives
// in status-page.ts; this module routes, sets headers and keeps errors and
// query strings away from clients and logs.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type pino from 'pino';
import type { StatusSource } from './status-types.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { VmseedError } from '../errors.ts';
import { createEventLoopMonitor, type HealthOptions } from './health.ts';
import { capConnectionsPerSource } from './connection-cap.ts';
import {
  CONTENT_SECURITY_POLICY,
  parseStateFilter,
  renderNotFoundPage,
  renderStatusPage,
  renderVmiPage,
  statusJson,
} from './status-page.ts';

export interface HttpServerOptions {
  listen: string; // host:port, [v6]:port or :port; port 0 picks a free one
  // What this listener answers (404 for the rest). Default 'all'.
  serve?: 'all' | 'probes' | 'status';
  metrics: Metrics;
  status: StatusSource;
  logger: pino.Logger;
  // Seconds between automatic reloads of the status pages.
  refreshSeconds?: number;
  health?: HealthOptions;
  // Open connections per source address (default 32).
  maxConnectionsPerSource?: number;
  // /readyz answers 503 when the StatusSource takes longer than this.
  readinessTimeoutMs?: number;
  now?: () => Date;
}

export interface HttpServer {
  address: { host: string; port: number };
  url: string;
  close(): Promise<void>;
}

export const MAX_URL_LENGTH = 2048;

const SECURITY_HEADERS: Record<string, string> = {
  'content-security-policy': CONTENT_SECURITY_POLICY,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-resource-policy': 'same-origin',
  'cache-control': 'no-store',
};

export function parseListen(listen: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d{1,5})$/.exec(listen.trim());
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 0 && port <= 65535)) {
    throw new VmseedError(
      'CONFIG_INVALID',
      `--listen "${listen}" is not host:port (e.g. 0.0.0.0:8080, [::1]:8080, :8080); set --listen to an address and a port 0-65535`,
      {
        kind: 'terminal',
        field: 'listen',
      },
    );
  }
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port };
}

interface Reply {
  status: number;
  type: string;
  body: string | Buffer;
  headers?: Record<string, string>;
}

const text = (status: number, body: string, headers?: Record<string, string>): Reply => ({
  status,
  type: 'text/plain; charset=utf-8',
  body,
  headers,
});
const html = (status: number, body: string): Reply => ({ status, type: 'text/html; charset=utf-8', body });
const json = (status: number, value: unknown): Reply => ({
  status,
  type: 'application/json; charset=utf-8',
  body: JSON.stringify(value, null, 2) + '\n',
});

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

// Stack frames only: the first line of a stack is the message, which for a
// foreign error may quote user input.
function safeErrorForLog(e: unknown): Record<string, unknown> {
  if (e instanceof VmseedError) return { code: e.code, message: e.message };
  if (e instanceof Error) return { type: e.name, stack: (e.stack ?? '').split('\n').slice(1).join('\n') };
  return { type: typeof e };
}

export async function startHttpServer(options: HttpServerOptions): Promise<HttpServer> {
  const { metrics, status } = options;
  const log = options.logger.child({ component: 'http' });
  const now = options.now ?? (() => new Date());
  const refreshSeconds = options.refreshSeconds ?? 10;
  const readinessTimeoutMs = options.readinessTimeoutMs ?? 5000;
  const { host, port } = parseListen(options.listen);
  const monitor = createEventLoopMonitor(options.health);

  const serve = options.serve ?? 'all';
  const probes = serve !== 'status';
  const detail = serve !== 'probes';

  async function route(url: URL): Promise<Reply> {
    const path = url.pathname;
    if (!probes && (path === '/metrics' || path === '/healthz' || path === '/readyz')) {
      return html(
        404,
        renderNotFoundPage(`no page at ${path} on the status listener; probes and /metrics are on --listen`),
      );
    }
    if (!detail) {
      if (path !== '/metrics' && path !== '/healthz' && path !== '/readyz') {
        return text(
          404,
          'not served here: this listener has /healthz, /readyz and /metrics; the status pages are on --status-listen (loopback: use kubectl port-forward)\n',
        );
      }
    }
    if (path === '/metrics') {
      return { status: 200, type: metrics.registry.contentType, body: await metrics.registry.metrics() };
    }
    if (path === '/healthz') {
      const r = monitor.report();
      return r.healthy
        ? text(200, `ok\nlast heartbeat ${r.lastBeatAgoMs} ms ago, max event loop lag ${r.maxLagMs} ms\n`)
        : text(503, `unhealthy\n${r.reasons.map((x) => `- ${x}\n`).join('')}`);
    }
    if (path === '/readyz') {
      let r: { ready: boolean; reasons: string[] };
      try {
        r = await withTimeout(status.readiness(), readinessTimeoutMs);
      } catch (e) {
        log.warn({ err: safeErrorForLog(e) }, 'readiness check failed');
        return text(503, 'not ready\n- readiness check failed; see the agent log\n');
      }
      return r.ready
        ? text(200, 'ok\n')
        : text(
            503,
            `not ready\n${(r.reasons.length ? r.reasons : ['no reason given']).map((x) => `- ${String(x).replace(/[\r\n]+/g, ' ')}\n`).join('')}`,
          );
    }
    const filter = parseStateFilter(url.searchParams.get('state'));
    // The list pages show why the agent is not ready: check now, so the
    // page is as fresh as /readyz (the result lands in the snapshot).
    if (path === '/status' || path === '/status/' || path === '/status.json') {
      await withTimeout(status.readiness(), readinessTimeoutMs).catch((e: unknown) =>
        log.warn({ err: safeErrorForLog(e) }, 'readiness check failed'),
      );
    }
    if (path === '/status' || path === '/status/') {
      return html(200, renderStatusPage(status.snapshot(), { now: now(), filter, refreshSeconds, probeLinks: probes }));
    }
    if (path === '/status.json') {
      return json(200, statusJson(status.snapshot(), filter, now()));
    }
    if (path === '/') {
      return {
        status: 302,
        type: 'text/plain; charset=utf-8',
        body: 'see /status\n',
        headers: { location: '/status' },
      };
    }
    const m = /^\/status\/([^/]+)\/([^/]+)\/?$/.exec(path);
    if (m) {
      let ns: string, name: string;
      try {
        ns = decodeURIComponent(m[1]);
        name = decodeURIComponent(m[2]);
      } catch {
        return html(400, renderNotFoundPage('malformed VMI name in the URL'));
      }
      const snap = status.snapshot();
      const rec = snap.vmis.find((v) => v.namespace === ns && v.name === name);
      if (!rec) return html(404, renderNotFoundPage(`no VMI ${ns}/${name} on this node`));
      return html(200, renderVmiPage(snap, rec, { now: now(), refreshSeconds }));
    }
    return html(404, renderNotFoundPage(`no page at ${path}`));
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = performance.now();
    const method = req.method ?? 'GET';
    const rawUrl = req.url ?? '/';
    let reply: Reply;
    let path = '';
    if (rawUrl.length > MAX_URL_LENGTH) {
      reply = text(414, `URL too long (limit ${MAX_URL_LENGTH} characters)\n`);
    } else if (method !== 'GET' && method !== 'HEAD') {
      reply = text(405, `method ${method.slice(0, 16)} not allowed; use GET or HEAD\n`, { allow: 'GET, HEAD' });
    } else {
      try {
        const url = new URL(rawUrl, 'http://vmseed.invalid');
        path = url.pathname;
        reply = await route(url);
      } catch (e) {
        log.error({ err: safeErrorForLog(e), path }, 'request failed');
        reply = text(500, 'internal error; see the agent log\n');
      }
    }
    const body = typeof reply.body === 'string' ? Buffer.from(reply.body) : reply.body;
    res.writeHead(reply.status, {
      ...SECURITY_HEADERS,
      'content-type': reply.type,
      'content-length': String(body.length),
      ...reply.headers,
    });
    res.end(method === 'HEAD' ? undefined : body);
    // The path only: query strings may carry tokens someone pasted.
    log.debug(
      {
        method: method.slice(0, 16),
        path: (path || rawUrl.split('?')[0]).slice(0, 256),
        status: reply.status,
        ms: Math.round((performance.now() - started) * 10) / 10,
      },
      'http request',
    );
  }

  // Node checks the header and request timeouts every 30 s by default: long
  // enough for slow clients to hold every socket in between.
  const server = createServer(
    { maxHeaderSize: 16 * 1024, requestTimeout: 30_000, headersTimeout: 10_000, connectionsCheckingInterval: 1000 },
    (req, res) => {
      handle(req, res).catch((e) => {
        log.error({ err: safeErrorForLog(e) }, 'response failed');
        res.destroy();
      });
    },
  );
  // One client (a pod flooding the probe port) must not starve the kubelet's
  // probes or Prometheus; browsers use about six connections.
  server.maxConnections = 1024;
  capConnectionsPerSource(server, options.maxConnectionsPerSource ?? 32);
  server.on('clientError', (_err, socket) => {
    // Destroyed once flushed: end() alone waits for a client that may never close.
    if (socket.writable)
      socket.end('HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n', () => socket.destroy());
    else socket.destroy();
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (e: Error) => {
      monitor.stop();
      reject(
        new VmseedError(
          'CONFIG_INVALID',
          `cannot listen on ${options.listen}: ${(e as NodeJS.ErrnoException).code ?? e.message}; choose another --listen address`,
          {
            kind: 'terminal',
            field: 'listen',
            cause: e,
          },
        ),
      );
    };
    server.once('error', onError);
    server.listen(port, host, () => {
      server.off('error', onError);
      resolve();
    });
  });

  const addr = server.address() as AddressInfo;
  const urlHost = addr.address === '0.0.0.0' ? '127.0.0.1' : addr.address === '::' ? '::1' : addr.address;
  const url = `http://${urlHost.includes(':') ? `[${urlHost}]` : urlHost}:${addr.port}`;
  log.info({ url, listen: options.listen, serve }, 'http server listening');

  let closing: Promise<void> | undefined;
  return {
    address: { host: addr.address, port: addr.port },
    url,
    close() {
      closing ??= new Promise<void>((resolve) => {
        monitor.stop();
        server.close(() => resolve());
        server.closeIdleConnections();
        // Keep-alive clients (browsers, Prometheus) would hold close() open.
        setTimeout(() => server.closeAllConnections(), 1000).unref();
      });
      return closing;
    },
  };
}
