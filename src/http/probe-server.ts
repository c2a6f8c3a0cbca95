// A process's probes and metrics without the agent's status record: /healthz
// (the process answers), /readyz (200 when every readiness check passes, 503
// with each failing check's reason otherwise), /metrics. The cluster
// component serves these; its checks are its services' own (the webhook's
// certificate). GET and HEAD only; no request body is read.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { capConnectionsPerSource } from '../core/connection-cap.ts';
import { listen } from '../core/listen.ts';

/** Why a service cannot serve now, or undefined when it can. */
export type ProbeCheck = () => string | undefined | Promise<string | undefined>;

/** A running probe listener. */
export interface ProbeServer {
  readonly address: AddressInfo;
  close(): Promise<void>;
}

// A check that hangs must not hang the kubelet's probe.
const CHECK_TIMEOUT_MS = 2_000;

async function failing(checks: readonly ProbeCheck[]): Promise<string[]> {
  const reasons = await Promise.all(
    checks.map(async (check) => {
      let timer: NodeJS.Timeout | undefined;
      try {
        return await Promise.race([
          Promise.resolve().then(check),
          new Promise<string>((resolve) => {
            timer = setTimeout(() => resolve(`readiness check took over ${CHECK_TIMEOUT_MS} ms`), CHECK_TIMEOUT_MS);
          }),
        ]);
      } catch (e) {
        return `readiness check failed: ${(e as Error).message}`;
      } finally {
        clearTimeout(timer);
      }
    }),
  );
  return reasons.filter((r): r is string => r !== undefined);
}

/**
 * Starts /healthz, /readyz and /metrics on `listen`; `checks()` is read on
 * every /readyz, so services added after the start are checked too. Rejects
 * with the listen error itself (EADDRINUSE, ...).
 */
export async function startProbeServer(options: {
  listen: { host: string; port: number };
  checks: () => readonly ProbeCheck[];
  registry: Registry;
}): Promise<ProbeServer> {
  const server: Server = createServer(
    { requestTimeout: 10_000, headersTimeout: 5_000, connectionsCheckingInterval: 1_000, maxHeaderSize: 16 * 1024 },
    (req, res) => {
      const send = (status: number, body: string, type = 'text/plain; charset=utf-8') => {
        res.writeHead(status, {
          'Content-Type': type,
          'Cache-Control': 'no-store',
          'Content-Length': Buffer.byteLength(body),
        });
        res.end(req.method === 'HEAD' ? undefined : body);
      };
      if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'method not allowed; use GET or HEAD\n');
      const path = (req.url ?? '').split('?')[0];
      if (path === '/healthz') return send(200, 'ok\n');
      if (path === '/readyz') {
        void failing(options.checks()).then((reasons) =>
          reasons.length === 0 ? send(200, 'ready\n') : send(503, `not ready:\n${reasons.join('\n')}\n`),
        );
        return;
      }
      if (path === '/metrics') {
        options.registry.metrics().then(
          (text) => send(200, text, options.registry.contentType),
          () => send(500, 'metrics unavailable\n'),
        );
        return;
      }
      send(404, 'not found\n');
    },
  );
  server.maxConnections = 256;
  capConnectionsPerSource(server, 32);
  server.on('clientError', (_err, socket) => socket.destroy());
  await listen(server, options.listen.port, options.listen.host);
  return {
    address: server.address() as AddressInfo,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
