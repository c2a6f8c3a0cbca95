// KubeVirt IMDS's endpoints beside the NoCloud files on the datasource
// listener: `/v1/identity`, `/v1/token` and the OpenStack tree, by source
// address (IMDS-annotated VMIs, as IMDS's sidecar answers its own pod) or
// under a VMI's token path. Only VMIs that are IMDS-annotated or opted in
// (ImdsFacts.enabled) are answered; any other answer is the NoCloud 404.
// With sessions on (session-endpoint.ts), `PUT <prefix>/session` too, and
// /v1/identity and /v1/token check the session header.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { Metrics } from '../../metrics/metrics.ts';
import { LogThrottle } from '../../core/log-throttle.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../types.ts';
import type { SeedIdentity } from '../identity.ts';
import { ImdsGuards, RETRY_AFTER_MS, type ImdsGuardLimits, type Throttle } from './guards.ts';
import { holdConnection } from '../flood/connection-hold.ts';
import { identityReply, type ImdsReply } from './identity-endpoint.ts';
import { parseImdsPath, type ImdsFamily, type ImdsRoute } from './imds-paths.ts';
import { tokenReply, type ServiceAccountTokenReader } from './token-endpoint.ts';
import { OpenstackTree } from '../openstack-paths.ts';
import { SessionEndpoint, type SessionMode } from './session-endpoint.ts';
import type { SessionLimits } from './sessions.ts';

export interface ImdsEndpointOptions {
  prefix: string;
  identity: SeedIdentity;
  logger: Logger;
  readToken?: ServiceAccountTokenReader;
  limits?: ImdsGuardLimits;
  metrics?: Metrics;
  // Monotonic milliseconds, for the buckets and the sessions' expiry.
  now?: () => number;
  // --datasource-imds-session; off (the default): no session path, no check.
  sessions?: { mode: SessionMode; limits?: SessionLimits };
  // Whether a VMI is still in the directory, and the directory's revision:
  // the sessions of a VMI that went are dropped. Needed with `sessions`.
  directory?: Pick<SeedDirectory, 'get' | 'revision'>;
}

const NOT_FOUND: ImdsReply = {
  status: 404,
  body: Buffer.from('not found\n'),
  headers: { 'Content-Type': 'text/plain; charset=utf-8' },
};
const COMMON_HEADERS = { 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' } as const;
const ONCE = ' (logged at most once a minute per kind)';

function headersOf(reply: ImdsReply): Record<string, string> {
  return { ...COMMON_HEADERS, ...reply.headers, 'Content-Length': String(reply.body.byteLength) };
}

// The answer to a flooding VM, built once: a refusal allocates nothing here.
const TOO_MANY_HEADERS = Object.freeze(headersOf(ImdsGuards.tooMany));

function send(res: ServerResponse, reply: ImdsReply, head: boolean): void {
  res.writeHead(reply.status, reply === ImdsGuards.tooMany ? TOO_MANY_HEADERS : headersOf(reply));
  res.end(head ? undefined : reply.body);
}

/**
 * The IMDS paths on the datasource listener. The server calls handle() for
 * every request before its own screen (these paths have guards of their
 * own); it answers IMDS paths and returns undefined for the rest.
 */
export class ImdsEndpoints {
  readonly #o: ImdsEndpointOptions;
  readonly #guards: ImdsGuards;
  readonly #openstack = new OpenstackTree();
  // One warning per kind of refusal per minute: a flood is seen, not logged
  // request by request.
  readonly #logThrottle = new LogThrottle<Throttle | number | 'token-mismatch'>();
  readonly #sessions: SessionEndpoint | undefined;

  constructor(options: ImdsEndpointOptions) {
    this.#o = options;
    this.#guards = new ImdsGuards(options.limits, options.now);
    const mode = options.sessions?.mode ?? 'off';
    const directory = options.directory;
    if (mode === 'off') this.#sessions = undefined;
    else if (directory === undefined) throw new TypeError('IMDS sessions need the directory');
    else
      this.#sessions = SessionEndpoint.create({
        mode,
        ...(options.sessions?.limits ? { limits: options.sessions.limits } : {}),
        now: options.now ?? (() => performance.now()),
        held: (uid) => directory.get(uid) !== undefined,
        revision: () => directory.revision,
      });
  }

  // The status answered, or undefined when the target is no IMDS path.
  handle(req: IncomingMessage, res: ServerResponse, target: string, source: string): number | undefined {
    const route = parseImdsPath(target, this.#o.prefix);
    // Sessions off: `<prefix>/session` is no path of these (the NoCloud 404).
    if (route === undefined || (route.family === 'session' && this.#sessions === undefined)) return undefined;
    const entry = this.#resolve(route, source);
    const throttled = this.#guards.throttle(entry?.uid, source);
    let reply: ImdsReply;
    if (throttled !== undefined) {
      this.#o.metrics?.imdsRateLimited.inc({ family: route.family, scope: throttled });
      this.#note(throttled, route.family);
      // The node-wide bucket is every VM's: only a client's own bucket holds its connection.
      if (throttled !== 'node') holdConnection(req, res, RETRY_AFTER_MS);
      reply = ImdsGuards.tooMany;
    } else {
      const refusal = this.#guards.check(req, route.family);
      if (refusal !== undefined) this.#note(refusal.status, route.family);
      reply = refusal ?? (entry === undefined ? NOT_FOUND : this.#answer(req, route, entry, source));
    }
    send(res, reply, req.method === 'HEAD');
    this.#o.metrics?.imdsRequests.inc({ family: route.family, status: String(reply.status) });
    return reply.status;
  }

  #resolve(
    route: ImdsRoute,
    source: string,
  ): (SeedDirectoryEntry & Required<Pick<SeedDirectoryEntry, 'imds'>>) | undefined {
    const entry =
      route.via === 'token'
        ? this.#o.identity.lookup({ kind: 'token', token: route.token, file: 'meta-data' }, source)
        : this.#o.identity.lookup({ kind: 'compat', file: 'meta-data' }, source);
    return entry?.imds?.enabled
      ? (entry as SeedDirectoryEntry & Required<Pick<SeedDirectoryEntry, 'imds'>>)
      : undefined;
  }

  #answer(
    req: IncomingMessage,
    route: ImdsRoute,
    entry: SeedDirectoryEntry & Required<Pick<SeedDirectoryEntry, 'imds'>>,
    source: string,
  ): ImdsReply {
    // A session token is never logged: a refusal is noted by its status alone.
    if (route.family === 'session') {
      const reply = this.#sessions!.put(req, entry.uid, source);
      if (reply.status !== 200) this.#note(reply.status, route.family);
      return reply;
    }
    const unauthorized = this.#sessions?.check(req, route.family, entry.uid, source);
    if (unauthorized !== undefined) {
      this.#note(unauthorized.status, route.family);
      return unauthorized;
    }
    switch (route.family) {
      case 'identity':
        return identityReply(entry, entry.imds);
      case 'token': {
        const reply = tokenReply(
          { namespace: entry.namespace, name: entry.name, facts: entry.imds },
          this.#o.readToken,
        );
        if ('status' in reply) return reply;
        this.#o.metrics?.imdsTokenRefused.inc({ reason: reply.refused });
        this.#note('token-mismatch', route.family);
        return NOT_FOUND;
      }
      case 'openstack':
        return this.#openstack.reply(entry.seed, route.openstack);
    }
  }

  // `kind`: the bucket that refused, the status of a guard's refusal, or a
  // launcher token that did not match its VMI.
  #note(kind: Throttle | number | 'token-mismatch', family: ImdsFamily): void {
    const held = this.#logThrottle.admit(kind, this.#o.now?.() ?? performance.now());
    if (held === undefined) return;
    if (kind === 'token-mismatch')
      this.#o.logger.warn(
        { family, kind, ...held },
        `IMDS token refused: its claims do not name the VMI's namespace, ServiceAccount and launcher pod${ONCE}`,
      );
    else if (typeof kind === 'number')
      this.#o.logger.warn({ family, status: kind, kind: `refused-${kind}`, ...held }, `IMDS request refused${ONCE}`);
    else
      this.#o.logger.warn(
        { family, scope: kind, kind: `rate-${kind}`, ...held },
        `IMDS endpoint rate limit hit${ONCE}`,
      );
  }
}
