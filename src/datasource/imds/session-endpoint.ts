// `--datasource-imds-session`: an IMDSv2-grade option for the IMDS paths.
// KubeVirt IMDS has no session or token PUT of its own (its sidecar serves
// GET and `Metadata: true` only: internal/imds/server.go), so the shape is
// EC2's IMDSv2 under vmseed's names:
//
//   PUT <prefix>/session  (or <prefix>/<token>/session)
//     X-Vmseed-Session-Ttl-Seconds: 1..21600
//   → 200 text/plain, the token; the TTL echoed in the same header
//   GET <prefix>/identity, <prefix>/token (and their token forms)
//     X-Vmseed-Session: <token>
//
// Statuses as EC2's: a PUT without a valid TTL is 400; a missing (in
// `required` mode), unknown, expired or foreign token is 401. The PUT is
// answered only to a source the IMDS paths answer (the VMI's launcher
// address, or its token path), else the same 404; it needs no `Metadata:
// true` (EC2's PUT needs only its TTL header, which plays the same part: a
// custom header and a PUT are what SSRF through a guest's web application
// can rarely send), and, like every datasource path, a forwarded one is
// refused (forwarded.ts), as EC2 refuses an IMDSv2 PUT with X-Forwarded-For.
// It must open its connection (connection-order.ts): the redirect's hop
// limit judges a connection by its first bytes.
//
// Modes: `optional` checks a session header when one is sent and serves
// requests without one as before; `required` refuses /v1/identity and
// /v1/token without a valid session. The NoCloud files and the OpenStack
// tree never need one: cloud-init reads them with no custom header.
import type { IncomingMessage } from 'node:http';
import { firstOnConnection } from './connection-order.ts';
import { goJson, imdsError, type ImdsReply } from './identity-endpoint.ts';
import type { ImdsFamily } from './imds-paths.ts';
import { SESSION_TTL_RANGE, SessionStore, type SessionLimits } from './sessions.ts';

/** The --datasource-imds-session values. */
export const SESSION_MODES = ['off', 'optional', 'required'] as const;
/** One of SESSION_MODES. */
export type SessionMode = (typeof SESSION_MODES)[number];

/** Request header of the PUT: the session's lifetime in seconds. */
export const SESSION_TTL_HEADER = 'X-Vmseed-Session-Ttl-Seconds';
/** Request header carrying a session token. */
export const SESSION_HEADER = 'X-Vmseed-Session';

const TTL_KEY = SESSION_TTL_HEADER.toLowerCase();
const TOKEN_KEY = SESSION_HEADER.toLowerCase();

const BAD_TTL = imdsError(
  400,
  'invalid_ttl',
  `${SESSION_TTL_HEADER} must be one integer of seconds from ${SESSION_TTL_RANGE.min} to ${SESSION_TTL_RANGE.max}`,
);
const NOT_FIRST = goJson(
  400,
  { error: 'session_not_first', message: 'PUT the session as the first request of a new connection' },
  { Connection: 'close' },
);
const UNAUTHORIZED = imdsError(
  401,
  'invalid_session',
  `a valid ${SESSION_HEADER} header is required: PUT /v1/session for one`,
);
const EXHAUSTED = goJson(
  503,
  { error: 'sessions_exhausted', message: 'too many live sessions on this node' },
  { 'Retry-After': '1' },
);

// `1`..`21600`, digits only, one header (Node joins repeated ones with ", ").
function ttlOf(req: IncomingMessage): number | undefined {
  const raw = req.headers[TTL_KEY];
  if (typeof raw !== 'string' || !/^[1-9][0-9]{0,4}$/.test(raw)) return undefined;
  const n = Number(raw);
  return n <= SESSION_TTL_RANGE.max ? n : undefined;
}

/** The session side of the IMDS endpoints, for a mode other than `off`. */
export class SessionEndpoint {
  readonly #mode: Exclude<SessionMode, 'off'>;
  readonly #store: SessionStore;

  constructor(mode: Exclude<SessionMode, 'off'>, store: SessionStore) {
    this.#mode = mode;
    this.#store = store;
  }

  static create(options: {
    mode: Exclude<SessionMode, 'off'>;
    limits?: SessionLimits;
    now: () => number;
    held: (uid: string) => boolean;
    revision: () => number;
  }): SessionEndpoint {
    return new SessionEndpoint(options.mode, new SessionStore(options));
  }

  /** The answer to a PUT that passed the guards and resolved to VMI `uid`. */
  put(req: IncomingMessage, uid: string, source: string): ImdsReply {
    if (!firstOnConnection(req)) return NOT_FIRST;
    const ttl = ttlOf(req);
    if (ttl === undefined) return BAD_TTL;
    const token = this.#store.issue(uid, source, ttl);
    if (token === undefined) return EXHAUSTED;
    return {
      status: 200,
      body: Buffer.from(token, 'ascii'),
      headers: { 'Content-Type': 'text/plain; charset=utf-8', [SESSION_TTL_HEADER]: String(ttl) },
    };
  }

  /**
   * The 401 for a request of `family` to VMI `uid` that its session does
   * not let through, or undefined. Only /v1/identity and /v1/token are
   * guarded.
   */
  check(req: IncomingMessage, family: ImdsFamily, uid: string, source: string): ImdsReply | undefined {
    if (family !== 'identity' && family !== 'token') return undefined;
    const token = req.headers[TOKEN_KEY];
    if (token === undefined) return this.#mode === 'required' ? UNAUTHORIZED : undefined;
    // A repeated header is joined by Node into one string, which no token is.
    if (typeof token !== 'string') return UNAUTHORIZED;
    return this.#store.verify(token, uid, source) === true ? undefined : UNAUTHORIZED;
  }
}
