// The agent's HTTP listeners: /metrics, /healthz, /readyz (probes, on the
// pod network) and /status, /status.json, /status/<namespace>/<name> (every
// tenant's VMI names, paths and errors: loopback by default in cluster
// mode), on one listener or two. node:http only. The paths live in
// server-routes.ts, rendering in status-page.ts, headers in reply.ts; this
// module refuses oversized and non-GET requests, listens, and keeps errors
// and query strings away from clients and logs.
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type pino from 'pino';
import type { StatusSource } from '../status/snapshot.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { VmseedError } from '../errors.ts';
import { createEventLoopMonitor, type EventLoopMonitor, type HealthOptions } from './health.ts';
import { capConnectionsPerSource } from '../core/connection-cap.ts';
import { listen } from '../core/listen.ts';
import { text, writeReply, type Reply } from './reply.ts';
import { safeErrorForLog } from './safe-error.ts';
import { createRouter } from './server-routes.ts';

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

export function parseListen(listen: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(listen.trim());
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

type Router = (url: URL) => Promise<Reply>;

// The reply to one request and the path it named ('' when it named none).
async function answer(method: string, rawUrl: string, route: Router, log: pino.Logger): Promise<[Reply, string]> {
  if (rawUrl.length > MAX_URL_LENGTH) return [text(414, `URL too long (limit ${MAX_URL_LENGTH} characters)\n`), ''];
  if (method !== 'GET' && method !== 'HEAD') {
    return [text(405, `method ${method.slice(0, 16)} not allowed; use GET or HEAD\n`, { allow: 'GET, HEAD' }), ''];
  }
  let path = '';
  try {
    const url = new URL(rawUrl, 'http://vmseed.invalid');
    path = url.pathname;
    return [await route(url), path];
  } catch (e) {
    log.error({ err: safeErrorForLog(e), path }, 'request failed');
    return [text(500, 'internal error; see the agent log\n'), path];
  }
}

async function handle(req: IncomingMessage, res: ServerResponse, route: Router, log: pino.Logger): Promise<void> {
  const started = performance.now();
  const method = req.method ?? 'GET';
  const rawUrl = req.url ?? '/';
  const [reply, path] = await answer(method, rawUrl, route, log);
  writeReply(res, reply, method === 'HEAD');
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
function createListener(maxConnectionsPerSource: number, onRequest: RequestListener): Server {
  const server = createServer(
    { maxHeaderSize: 16 * 1024, requestTimeout: 30_000, headersTimeout: 10_000, connectionsCheckingInterval: 1000 },
    onRequest,
  );
  // One client (a pod flooding the probe port) must not starve the kubelet's
  // probes or Prometheus; browsers use about six connections.
  server.maxConnections = 1024;
  capConnectionsPerSource(server, maxConnectionsPerSource);
  server.on('clientError', (_err, socket) => {
    // Destroyed once flushed: end() alone waits for a client that may never close.
    if (socket.writable)
      socket.end('HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n', () => socket.destroy());
    else socket.destroy();
  });
  return server;
}

// A listen failure is a configuration error naming --listen; the monitor
// started for this server stops with it.
async function listenOrExplain(
  server: Server,
  at: { host: string; port: number },
  listenValue: string,
  monitor: EventLoopMonitor,
): Promise<void> {
  try {
    await listen(server, at.port, at.host);
  } catch (e) {
    monitor.stop();
    throw new VmseedError(
      'CONFIG_INVALID',
      `cannot listen on ${listenValue}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}; choose another --listen address`,
      {
        kind: 'terminal',
        field: 'listen',
        cause: e,
      },
    );
  }
}

// A URL a client on this host can use: the loopback address for a wildcard.
function urlOf(addr: AddressInfo): string {
  const urlHost = addr.address === '0.0.0.0' ? '127.0.0.1' : addr.address === '::' ? '::1' : addr.address;
  return `http://${urlHost.includes(':') ? `[${urlHost}]` : urlHost}:${addr.port}`;
}

function closeOnce(server: Server, monitor: EventLoopMonitor): () => Promise<void> {
  let closing: Promise<void> | undefined;
  return () => {
    closing ??= new Promise<void>((resolve) => {
      monitor.stop();
      server.close(() => resolve());
      server.closeIdleConnections();
      // Keep-alive clients (browsers, Prometheus) would hold close() open.
      setTimeout(() => server.closeAllConnections(), 1000).unref();
    });
    return closing;
  };
}

/**
 * Starts one of the agent's HTTP listeners (probes, /metrics and/or the status
 * pages, by `serve`). Throws a terminal CONFIG_INVALID when the address does not
 * parse or cannot be listened on.
 */
export async function startHttpServer(options: HttpServerOptions): Promise<HttpServer> {
  const log = options.logger.child({ component: 'http' });
  const at = parseListen(options.listen);
  const monitor = createEventLoopMonitor(options.health);
  const serve = options.serve ?? 'all';
  const route = createRouter({
    serve,
    metrics: options.metrics,
    status: options.status,
    monitor,
    log,
    now: options.now ?? (() => new Date()),
    refreshSeconds: options.refreshSeconds ?? 10,
    readinessTimeoutMs: options.readinessTimeoutMs ?? 5000,
  });
  const server = createListener(options.maxConnectionsPerSource ?? 32, (req, res) => {
    handle(req, res, route, log).catch((e) => {
      log.error({ err: safeErrorForLog(e) }, 'response failed');
      res.destroy();
    });
  });
  await listenOrExplain(server, at, options.listen, monitor);
  const addr = server.address() as AddressInfo;
  const url = urlOf(addr);
  log.info({ url, listen: options.listen, serve }, 'http server listening');
  return { address: { host: addr.address, port: addr.port }, url, close: closeOnce(server, monitor) };
}
