// The datasource's node:http server with its socket-level limits: header
// size, timeouts, connections in all and per source, and a plain answer to
// malformed HTTP.
import { createServer, type RequestListener, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Metrics } from '../metrics/metrics.ts';
import { capConnectionsPerSource } from '../core/connection-cap.ts';
import type { DatasourceLimits } from './types.ts';

export function createDatasourceListener(
  limits: DatasourceLimits,
  metrics: Metrics | undefined,
  onRequest: RequestListener,
): Server {
  const server: Server = createServer(
    {
      maxHeaderSize: limits.maxHeaderBytes ?? 8192,
      requestTimeout: limits.requestTimeoutMs ?? 5_000,
      headersTimeout: limits.headersTimeoutMs ?? 3_000,
      keepAliveTimeout: limits.keepAliveTimeoutMs ?? 5_000,
      connectionsCheckingInterval: limits.connectionsCheckingIntervalMs ?? 500,
    },
    onRequest,
  );
  server.maxConnections = limits.maxConnections ?? 1024;
  capConnectionsPerSource(server, limits.maxConnectionsPerSource ?? 32, () =>
    metrics?.datasourceConnectionsRefused.inc(),
  );
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => answerMalformed(err, socket, metrics));
  return server;
}

// Malformed HTTP (bad request line, oversized headers): answer plainly,
// with the same no-store header, and close.
function answerMalformed(err: NodeJS.ErrnoException, socket: Duplex, metrics: Metrics | undefined): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
  // Destroyed once the answer is handed to the kernel: end() alone would
  // keep the socket (and the source's connection slot) until the client
  // closes its side, which a client that never reads never does.
  socket.end(`HTTP/1.1 ${status}\r\nCache-Control: no-store\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`, () =>
    socket.destroy(),
  );
  metrics?.datasourceRequests.inc({ endpoint: 'other', status: status.slice(0, 3) });
}
