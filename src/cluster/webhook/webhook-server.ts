// The admission webhook's HTTPS listener: the API server POSTs an
// AdmissionReview to WEBHOOK_PATH and gets one back. The body's size is
// checked before it is read in full and before it is parsed; slow or idle
// clients are cut by the socket timeouts; every failure is an answer, never
// a crash. The certificate is swapped in place (setSecureContext) when the
// directory's files change.
// A connection that says nothing is cut within the header deadline (5 s)
// from its TCP accept: TLS never starts on a silent TCP connection, so
// Node's headersTimeout (which starts after the handshake) would not apply;
// the TLS handshake timeout and a timer on the raw socket do. One source
// holds at most maxConnectionsPerSource of the slots.
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Logger } from 'pino';
import type { Metrics, WebhookResult } from '../../metrics/metrics.ts';
import { readBoundedBody } from '../../core/bounded-body.ts';
import { capConnectionsPerSource } from '../../core/connection-cap.ts';
import { CertDir } from './certs.ts';
import { mutateVmi, type MutateOptions } from './mutate.ts';
import { readReview, reviewResponse } from './review.ts';

export const WEBHOOK_PATH = '/mutate-virtualmachineinstance';

export interface WebhookLimits {
  // Largest AdmissionReview body read (413 beyond). Default 2 MiB: a VMI the
  // API server stores (etcd's default request limit is 1.5 MiB) fits.
  maxBodyBytes?: number;
  maxConnections?: number;
  // Open connections one source address may hold (default 16: an API
  // server keeps a few per replica).
  maxConnectionsPerSource?: number;
  // From the TCP accept to the first request's headers, TLS handshake
  // included (default 5 s).
  headerDeadlineMs?: number;
  requestTimeoutMs?: number;
  headersTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
}

export interface WebhookServerOptions {
  listen: { host: string; port: number };
  certDir: string;
  logger: Logger;
  mutate: MutateOptions;
  limits?: WebhookLimits;
  certPollMs?: number;
  now?: () => Date;
  metrics?: Metrics;
}

/** A running admission webhook listener; problem() feeds the cluster component's readiness. */
export interface WebhookServer {
  readonly address: AddressInfo;
  // Why the webhook cannot serve (certificate missing, invalid, expired), or undefined.
  problem(): string | undefined;
  // Re-reads the certificate now (tests; the watch and poll do it otherwise).
  reloadCertificate(): Promise<void>;
  close(): Promise<void>;
}

const TEXT = { 'Content-Type': 'text/plain; charset=utf-8', 'Cache-Control': 'no-store' } as const;

function refuse(res: ServerResponse, status: number, message: string, close = false): 'refused' {
  const body = `${message}\n`;
  res.writeHead(status, {
    ...TEXT,
    'Content-Length': String(Buffer.byteLength(body)),
    ...(close ? { Connection: 'close' } : {}),
  });
  res.end(body);
  return 'refused';
}

// The body, or undefined when there is nothing to answer: the 413 is sent
// (too large), or the request ended before its body did.
async function readBody(req: IncomingMessage, res: ServerResponse, max: number): Promise<Buffer | undefined> {
  const tooLarge = `the AdmissionReview is larger than ${max} bytes`;
  const declared = Number(req.headers['content-length'] ?? NaN);
  if (declared > max) {
    refuse(res, 413, tooLarge, true);
    req.resume();
    return undefined;
  }
  const body = await readBoundedBody(req, max);
  if (body === 'too-large') {
    // The refusal is sent in full, then the connection goes with the rest
    // of the body unread.
    res.once('finish', () => req.destroy());
    refuse(res, 413, tooLarge, true);
  }
  return typeof body === 'string' ? undefined : body;
}

class ReviewHandler {
  readonly #o: WebhookServerOptions;
  readonly #maxBody: number;
  readonly #log: Logger;

  constructor(options: WebhookServerOptions, log: Logger) {
    this.#o = options;
    this.#maxBody = options.limits?.maxBodyBytes ?? 2 * 1024 * 1024;
    this.#log = log;
  }

  async handle(req: IncomingMessage, res: ServerResponse): Promise<WebhookResult> {
    if ((req.url ?? '').split('?')[0] !== WEBHOOK_PATH) return refuse(res, 404, 'not found');
    if (req.method !== 'POST') return refuse(res, 405, 'POST an AdmissionReview');
    const type = String(req.headers['content-type'] ?? '')
      .split(';')[0]
      .trim()
      .toLowerCase();
    if (type !== 'application/json') return refuse(res, 415, 'the AdmissionReview must be application/json');
    const body = await readBody(req, res, this.#maxBody);
    if (body === undefined) return 'refused';
    const read = readReview(body);
    if (read.kind === 'invalid') return refuse(res, 400, read.message);
    if (read.kind === 'pass') {
      this.#answer(res, reviewResponse(read.uid));
      return 'unchanged';
    }
    const { uid, namespace, object } = read.review;
    const patch = mutateVmi(object, namespace, this.#o.mutate);
    this.#log.debug({ uid, namespace, operations: patch.length }, 'VMI admitted');
    this.#answer(res, reviewResponse(uid, patch));
    return patch.length > 0 ? 'patched' : 'unchanged';
  }

  #answer(res: ServerResponse, json: string): void {
    res.writeHead(200, {
      'Content-Type': 'application/json',
      'Cache-Control': 'no-store',
      'Content-Length': String(Buffer.byteLength(json)),
    });
    res.end(json);
  }
}

// Destroys each accepted socket whose first request has not arrived (headers
// read) within `ms` of its accept. The raw socket is the one that exists
// from the accept on; a request names its TLS socket, which shares its
// peer address and port, so the two meet on those.
function headerDeadline(server: Server, ms: number): { arrived(socket: Socket): void } {
  const timers = new Map<string, NodeJS.Timeout>();
  const keyOf = (s: Socket) => `${s.remoteAddress}|${s.remotePort}`;
  server.on('connection', (raw: Socket) => {
    // Refused by the per-source cap already.
    if (raw.destroyed) return;
    const key = keyOf(raw);
    const timer = setTimeout(() => raw.destroy(), ms);
    timer.unref();
    timers.set(key, timer);
    raw.once('close', () => {
      clearTimeout(timer);
      if (timers.get(key) === timer) timers.delete(key);
    });
  });
  return {
    arrived(socket) {
      const key = keyOf(socket);
      const timer = timers.get(key);
      if (timer === undefined) return;
      clearTimeout(timer);
      timers.delete(key);
    },
  };
}

function listening(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/**
 * Starts the admission webhook's HTTPS listener on `options.listen`, serving the
 * certificate in `certDir` (reloaded when its files change); rejects when it
 * cannot listen.
 */
export async function startWebhookServer(options: WebhookServerOptions): Promise<WebhookServer> {
  const log = options.logger.child({ component: 'webhook' });
  const limits = options.limits ?? {};
  const handler = new ReviewHandler(options, log);
  const headerDeadlineMs = limits.headerDeadlineMs ?? 5_000;
  // No certificate yet: handshakes fail until one is loaded.
  const server = createServer({
    handshakeTimeout: headerDeadlineMs,
    requestTimeout: limits.requestTimeoutMs ?? 10_000,
    headersTimeout: limits.headersTimeoutMs ?? headerDeadlineMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs ?? 30_000,
    connectionsCheckingInterval: 1_000,
    maxHeaderSize: 16 * 1024,
  });
  server.maxConnections = limits.maxConnections ?? 64;
  capConnectionsPerSource(server, limits.maxConnectionsPerSource ?? 16);
  const firstRequest = headerDeadline(server, headerDeadlineMs);
  const metrics = options.metrics;
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    firstRequest.arrived(req.socket);
    const started = performance.now();
    void handler
      .handle(req, res)
      .catch((e: unknown): WebhookResult => {
        log.error({ err: { message: (e as Error)?.message } }, 'admission review failed');
        if (!res.headersSent) refuse(res, 500, 'internal error', true);
        else res.destroy();
        return 'error';
      })
      .then((result) => {
        metrics?.webhookRequests.inc({ result });
        metrics?.webhookRequestDuration.observe((performance.now() - started) / 1000);
      });
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  server.on('tlsClientError', (_err, socket) => socket.destroy());
  const certs = new CertDir({
    dir: options.certDir,
    logger: log,
    onLoad: (pair) => {
      server.setSecureContext({ cert: pair.cert, key: pair.key });
      metrics?.webhookCertificateExpiry.set(pair.notAfter.getTime() / 1000);
    },
    ...(options.certPollMs !== undefined ? { pollMs: options.certPollMs } : {}),
    ...(options.now ? { now: options.now } : {}),
  });
  await certs.check();
  certs.start();
  try {
    await listening(server, options.listen.port, options.listen.host);
  } catch (e) {
    certs.stop();
    throw e;
  }
  const address = server.address() as AddressInfo;
  log.info({ address: address.address, port: address.port, path: WEBHOOK_PATH }, 'admission webhook listening');
  return {
    address,
    problem: () => certs.problem(),
    reloadCertificate: () => certs.check(),
    close: () =>
      new Promise<void>((resolve, reject) => {
        certs.stop();
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      }),
  };
}
