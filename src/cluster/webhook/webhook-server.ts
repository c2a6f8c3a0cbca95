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
// With a client CA (--webhook-client-ca) the handshake requires a client
// certificate that CA signed (the API server's, configured in its
// AdmissionConfiguration), and, with names, one whose CN or DNS name is one
// of them; any other client gets no HTTP answer at all.
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import type { Metrics, WebhookResult } from '../../metrics/metrics.ts';
import { readBoundedBody } from '../../core/bounded-body.ts';
import { capConnectionsPerSource } from '../../core/connection-cap.ts';
import { CertDir } from './certs.ts';
import { ClientCaFile, clientNames } from './client-ca.ts';
import { mutateVmi, type MutateOptions } from './mutate.ts';
import { adoptionAsked, decideAdoption, type AdoptionDecision, type AdoptionOptions } from './adopt.ts';
import type { AdoptionEvents } from './adoption-events.ts';
import { gatedResolver, vmVouches } from './review-trust.ts';
import type { KubeApi } from '../../kube/api-client.ts';
import type { RefResolver } from '../../api/objects.ts';
import { readReview, reviewResponse } from './review.ts';
import { MAX_WARNING_BYTES, cut, schemaWarnings, type SchemaWarningOptions } from './schema-warnings.ts';

export const WEBHOOK_PATH = '/mutate-virtualmachineinstance';
// The configuration's second webhook, which the API server calls only for
// VMIs in a namespace labelled vmseed.io/adopt=true (its namespaceSelector):
// the path says so, since a review carries no namespace labels. A caller
// that posts here itself gets a patch back and changes nothing.
export const ADOPT_PATH = '/adopt-virtualmachineinstance';
// An Event's message (the API server cuts longer ones; so do we, on a character).
const MAX_EVENT_MESSAGE = 1024;

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
  // Require a client certificate signed by the CA bundle in `file`
  // (reloaded when it changes), and, with `names`, one whose subject CN or
  // a DNS name is one of them. Absent: any TLS client is answered.
  clientAuth?: { caFile: string; names?: readonly string[] };
  // Warn (never refuse) about schema problems of the VMI's cloud-init data
  // (schema-warnings.ts). Absent: no check.
  schemas?: SchemaWarningOptions;
  // Adoption of KubeVirt cloud-init volumes (adopt.ts), and where a skipped
  // one is said as an Event. Absent: a VMI that asks is told adoption is off.
  adoption?: AdoptionOptions & { events?: AdoptionEvents };
  // Reads a VMI's VirtualMachine, which vouches for a review that the
  // caller's certificate does not (review-trust.ts). Absent, and without
  // clientAuth: no review makes the webhook read an object or write an Event.
  vms?: KubeApi;
}

/** A running admission webhook listener; problem() feeds the cluster component's readiness. */
export interface WebhookServer {
  readonly address: AddressInfo;
  // Why the webhook cannot serve (certificate or client CA missing, invalid, expired), or undefined.
  problem(): string | undefined;
  // Re-reads the certificate and the client CA now (tests; the watch and poll do it otherwise).
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
    const path = (req.url ?? '').split('?')[0];
    if (path !== WEBHOOK_PATH && path !== ADOPT_PATH) return refuse(res, 404, 'not found');
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
    const { uid, namespace, object, dryRun } = read.review;
    const vouched = this.#vouching(object, namespace);
    const gate = (refs: RefResolver | undefined) => refs && gatedResolver(refs, vouched);
    const adoption = await this.#adoption(object, path === ADOPT_PATH, gate(this.#o.adoption?.secrets));
    const patch = mutateVmi(object, this.#o.mutate, adoption.kind === 'adopt' ? adoption.record : undefined);
    // Warnings only: the patch and `allowed` never depend on them.
    const schemas = this.#o.schemas;
    const warnings = schemas
      ? await schemaWarnings(object, namespace, { ...schemas, secrets: gate(schemas.secrets) })
      : [];
    if (adoption.kind === 'skipped') {
      const message = `ADOPTION_SKIPPED (${adoption.field}): KubeVirt builds the cloud-init volume, not vmseed: ${adoption.reason}`;
      warnings.unshift(cut(message, MAX_WARNING_BYTES));
      // An Event only for a review known to be the API server's: anyone
      // else could otherwise write Events into any namespace.
      const events = this.#o.adoption?.events;
      if (!dryRun && events && (await vouched()) === undefined)
        events.skipped(object, namespace, cut(message, MAX_EVENT_MESSAGE));
    }
    this.#log.debug(
      { uid, namespace, operations: patch.length, warnings: warnings.length, adoption: adoption.kind },
      'VMI admitted',
    );
    this.#answer(res, reviewResponse(uid, patch, warnings));
    return patch.length > 0 ? 'patched' : 'unchanged';
  }

  // Why this review may not make the webhook read objects or write Events,
  // or undefined (review-trust.ts); asked at most once per review.
  #vouching(object: unknown, namespace: string): () => Promise<string | undefined> {
    let answer: Promise<string | undefined> | undefined;
    return () => {
      if (this.#o.clientAuth) return Promise.resolve(undefined);
      const vms = this.#o.vms;
      answer ??= vms
        ? vmVouches(object, namespace, vms).catch(
            (e: unknown) => `its VirtualMachine could not be read (${(e as Error).message})`,
          )
        : Promise.resolve('the webhook authenticates no caller (--webhook-client-ca) and has no API credentials');
      return answer;
    };
  }

  async #adoption(
    object: unknown,
    namespaceOptIn: boolean,
    secrets: RefResolver | undefined,
  ): Promise<AdoptionDecision> {
    const meta = isObject(object) && isObject(object.metadata) ? object.metadata : {};
    const annotations: Record<string, string> = {};
    if (isObject(meta.annotations))
      for (const [k, v] of Object.entries(meta.annotations)) if (typeof v === 'string') annotations[k] = v;
    const by = adoptionAsked(annotations, namespaceOptIn);
    if (by === undefined) return { kind: 'none' };
    if (!this.#o.adoption) return { kind: 'skipped', reason: 'adoption is off in this webhook', field: 'metadata' };
    const { secrets: _, ...options } = this.#o.adoption;
    return decideAdoption(object, by, secrets ? { ...options, secrets } : options);
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

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
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

// A handshake refused for its client certificate, logged at most once a
// minute with the number left unlogged: a misconfigured CA shows in the log
// (the API server's calls fail, and with failurePolicy Ignore its VMIs are
// created without the gate), a scanner does not flood it.
function refusalLog(log: Logger, everyMs = 60_000): (reason: string, address: string | undefined) => void {
  let last = -Infinity;
  let unlogged = 0;
  return (reason, address) => {
    const now = performance.now();
    if (now - last < everyMs) {
      unlogged++;
      return;
    }
    log.warn({ reason, address, unlogged }, 'webhook client refused: no client certificate the client CA accepts');
    last = now;
    unlogged = 0;
  };
}

// What was wrong with the client's certificate, when that is why the
// handshake failed: none sent (OpenSSL's error), or one that does not verify
// against the client CA (Node's check after the handshake, which leaves the
// reason on the socket).
function clientCertificateProblem(err: Error & { code?: string }, socket: TLSSocket): string | undefined {
  if (socket.authorizationError) return `client certificate: ${String(socket.authorizationError)}`;
  if (err.code === 'ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE') return 'no client certificate';
  return undefined;
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
  const clientAuth = options.clientAuth;
  // No certificate yet: handshakes fail until one is loaded. With a client
  // CA, the client's certificate is verified against the CA installed with
  // the serving certificate (install() below); neither is installed before
  // the CA loads, so the default root CAs never verify a client.
  const server = createServer({
    ...(clientAuth ? { requestCert: true, rejectUnauthorized: true } : {}),
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
  const refused = refusalLog(log);
  // Connections whose handshake passed the client checks, with the client
  // CA generation they passed under: one made under an earlier CA is
  // answered once more, with Connection: close, so every caller is checked
  // against the CA in force.
  const verified = new WeakMap<Socket, number>();
  let caGeneration = 0;
  const names = clientAuth?.names?.length ? new Set(clientAuth.names) : undefined;
  if (clientAuth) {
    server.on('secureConnection', (socket: TLSSocket) => {
      if (!socket.authorized) {
        socket.destroy();
        return;
      }
      if (names && !clientNames(socket.getPeerCertificate()).some((n) => names.has(n))) {
        refused('client certificate name not in --webhook-client-names', socket.remoteAddress);
        socket.destroy();
        return;
      }
      verified.set(socket, caGeneration);
    });
  }
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    firstRequest.arrived(req.socket);
    if (clientAuth) {
      const generation = verified.get(req.socket);
      // secureConnection refused it; never answered.
      if (generation === undefined) {
        req.socket.destroy();
        return;
      }
      if (generation !== caGeneration) res.setHeader('Connection', 'close');
    }
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
  server.on('tlsClientError', (err: Error, socket: TLSSocket) => {
    const problem = clientAuth ? clientCertificateProblem(err, socket) : undefined;
    if (problem) refused(problem, socket.remoteAddress);
    socket.destroy();
  });
  // The serving pair and, with client authentication, the client CA: one
  // context, installed once both are loaded.
  const install = (): void => {
    const pair = certs.pair;
    if (pair === undefined) return;
    if (clientAuth === undefined) {
      server.setSecureContext({ cert: pair.cert, key: pair.key });
      return;
    }
    const bundle = clientCa?.bundle;
    if (bundle !== undefined) server.setSecureContext({ cert: pair.cert, key: pair.key, ca: bundle.pem });
  };
  const certs = new CertDir({
    dir: options.certDir,
    logger: log,
    onLoad: (pair) => {
      install();
      metrics?.webhookCertificateExpiry.set(pair.notAfter.getTime() / 1000);
    },
    ...(options.certPollMs !== undefined ? { pollMs: options.certPollMs } : {}),
    ...(options.now ? { now: options.now } : {}),
  });
  const clientCa = clientAuth
    ? new ClientCaFile({
        file: clientAuth.caFile,
        logger: log,
        onLoad: () => {
          caGeneration++;
          install();
          // Idle connections made under the previous CA go now, busy ones
          // after their answer (Connection: close).
          server.closeIdleConnections();
        },
        ...(options.certPollMs !== undefined ? { pollMs: options.certPollMs } : {}),
        ...(options.now ? { now: options.now } : {}),
      })
    : undefined;
  await Promise.all([certs.check(), clientCa?.check()]);
  certs.start();
  clientCa?.start();
  const stopReload = (): void => {
    certs.stop();
    clientCa?.stop();
  };
  try {
    await listening(server, options.listen.port, options.listen.host);
  } catch (e) {
    stopReload();
    throw e;
  }
  const address = server.address() as AddressInfo;
  log.info(
    {
      address: address.address,
      port: address.port,
      path: WEBHOOK_PATH,
      clientCa: clientAuth?.caFile ?? null,
      ...(names ? { clientNames: [...names] } : {}),
    },
    'admission webhook listening',
  );
  return {
    address,
    problem: () => [certs.problem(), clientCa?.problem()].filter((p) => p !== undefined).join('; ') || undefined,
    reloadCertificate: async () => {
      await Promise.all([certs.check(), clientCa?.check()]);
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        stopReload();
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      }),
  };
}
