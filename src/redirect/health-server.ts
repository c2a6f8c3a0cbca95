// The redirect container's probes and metrics: /healthz (the process
// answers), /readyz (200 only while the DNAT rule is in place, so the pod is
// not Ready when guests' requests would go nowhere), /metrics. /readyz
// answers JSON `{"inPlace":bool,"reason":code,"message":text}` to a client
// that accepts application/json (the agent's status page polls it).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { RedirectKeeper } from './keeper.ts';
import type { RedirectMetrics } from './redirect-metrics.ts';

// Keeps the JSON well under the 4 KiB a poller reads (nft's stderr is
// already cut to 300 characters inside the message).
const MESSAGE_MAX = 1024;

export interface RedirectHealthServer {
  readonly address: AddressInfo;
  close(): Promise<void>;
}

/**
 * Starts the redirect container's /healthz, /readyz and /metrics listener;
 * rejects when it cannot listen.
 */
export async function startRedirectHealth(options: {
  listen: { host: string; port: number };
  keeper: Pick<RedirectKeeper, 'inPlace' | 'lastError' | 'reason'>;
  metrics: RedirectMetrics;
}): Promise<RedirectHealthServer> {
  const { keeper, metrics } = options;
  const server: Server = createServer({ requestTimeout: 10_000, headersTimeout: 5_000 }, (req, res) => {
    const send = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, {
        'Content-Type': type,
        'Cache-Control': 'no-store',
        'Content-Length': Buffer.byteLength(body),
      });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'method not allowed\n');
    const path = (req.url ?? '').split('?')[0];
    if (path === '/healthz') return send(200, 'ok\n');
    if (path === '/readyz') {
      if ((req.headers.accept ?? '').includes('application/json')) {
        const body = keeper.inPlace
          ? { inPlace: true }
          : {
              inPlace: false,
              reason: keeper.reason,
              ...(keeper.lastError ? { message: keeper.lastError.slice(0, MESSAGE_MAX) } : {}),
            };
        return send(keeper.inPlace ? 200 : 503, `${JSON.stringify(body)}\n`, 'application/json');
      }
      if (keeper.inPlace) return send(200, 'redirect in place\n');
      return send(503, `redirect not in place${keeper.lastError ? `: ${keeper.lastError}` : ''}\n`);
    }
    if (path === '/metrics') {
      metrics.registry.metrics().then(
        (text) => send(200, text, metrics.registry.contentType),
        () => send(500, 'metrics unavailable\n'),
      );
      return;
    }
    send(404, 'not found\n');
  });
  server.maxConnections = 64;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.listen.port, options.listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    address: server.address() as AddressInfo,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
