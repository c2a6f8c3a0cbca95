// The IMDS sessions of `--datasource-imds-session` (session-endpoint.ts):
// short-lived tokens a VMI's guest gets with `PUT /v1/session` and sends back
// in `X-Vmseed-Session`, as EC2's IMDSv2 does with `PUT /latest/api/token`.
// A session is bound to the VMI it was issued for, the source address that
// asked and an expiry: a token replayed from another address, for another
// VMI or after its expiry opens nothing.
//
// Tokens are 32 random bytes, base64url, held only here: never logged,
// counted or shown. A lookup is one hash, one Map lookup and one
// constant-time compare, the same work for a miss as for a hit (the Map is
// keyed by the token's SHA-256, which the sender does not choose).
//
// Memory is bounded before any work: at most `perVmi` live sessions per
// VMI (a new one drops that VMI's oldest: a guest that leaks sessions
// spends only its own) and `perNode` in all (past that, expired ones are
// swept and the PUT is refused while none is). Expired sessions are refused
// at once and dropped at the next sweep (at most one a second); the
// sessions of a VMI that has left the directory are dropped at the first
// sweep after the directory's revision moves.
import { hash, randomBytes, timingSafeEqual } from 'node:crypto';

/** The defaults of SessionLimits. */
export const SESSION_DEFAULTS = {
  perVmi: 16,
  perNode: 16_384,
} as const;

/** How many sessions may live at once (defaults: SESSION_DEFAULTS). */
export interface SessionLimits {
  // Live sessions of one VMI; a new one drops its oldest.
  perVmi?: number;
  // Live sessions of the node; past it a PUT is refused (503).
  perNode?: number;
}

/** EC2 IMDSv2's TTL range, in seconds: 1 second to 6 hours. */
export const SESSION_TTL_RANGE = { min: 1, max: 21_600 } as const;

/** The length of a session token: 32 bytes, base64url without padding. */
export const SESSION_TOKEN_LENGTH = 43;

const SWEEP_EVERY_MS = 1000;
// Compared against when a token is not held: NUL bytes, which no base64url text holds.
const DECOY = Buffer.alloc(SESSION_TOKEN_LENGTH, 0);
const SHAPE = /^[A-Za-z0-9_-]{43}$/;

interface Session {
  token: Buffer;
  uid: string;
  source: string;
  // Monotonic milliseconds.
  expiresAt: number;
}

/** Why a token opened nothing; for the refusal log line's kind, never with the token. */
export type SessionRefusal = 'unknown' | 'expired' | 'other-source' | 'other-vmi';

const keyOf = (token: string) => hash('sha256', token, 'base64');

export class SessionStore {
  // SHA-256 of the token -> the session.
  readonly #byKey = new Map<string, Session>();
  // VMI UID -> its sessions' keys, oldest first.
  readonly #byVmi = new Map<string, string[]>();
  readonly #perVmi: number;
  readonly #perNode: number;
  readonly #now: () => number;
  // Whether a VMI is still in the directory, and the directory's revision.
  readonly #held: (uid: string) => boolean;
  readonly #revision: () => number;
  #sweptRevision: number | undefined;
  #sweptAt = -Infinity;

  constructor(options: {
    limits?: SessionLimits;
    now: () => number;
    held: (uid: string) => boolean;
    revision: () => number;
  }) {
    const l = { ...SESSION_DEFAULTS, ...options.limits };
    this.#perVmi = l.perVmi;
    this.#perNode = l.perNode;
    this.#now = options.now;
    this.#held = options.held;
    this.#revision = options.revision;
  }

  get size(): number {
    return this.#byKey.size;
  }

  /**
   * A new session of VMI `uid` for `source`, valid `ttlSeconds`; undefined
   * when the node's budget is spent (checked before a byte is drawn).
   */
  issue(uid: string, source: string, ttlSeconds: number): string | undefined {
    this.#maybeSweep();
    if (this.#byKey.size >= this.#perNode) {
      this.#sweep();
      if (this.#byKey.size >= this.#perNode) return undefined;
    }
    const keys = this.#byVmi.get(uid) ?? [];
    while (keys.length >= this.#perVmi) this.#byKey.delete(keys.shift()!);
    const token = randomBytes(32).toString('base64url');
    const key = keyOf(token);
    this.#byKey.set(key, {
      token: Buffer.from(token, 'ascii'),
      uid,
      source,
      expiresAt: this.#now() + ttlSeconds * 1000,
    });
    keys.push(key);
    this.#byVmi.set(uid, keys);
    return token;
  }

  /**
   * Whether `token` is a live session of VMI `uid` issued to `source`;
   * otherwise why not.
   */
  verify(token: string, uid: string, source: string): true | SessionRefusal {
    this.#maybeSweep();
    const shaped = SHAPE.test(token);
    const session = shaped ? this.#byKey.get(keyOf(token)) : undefined;
    const given = shaped ? Buffer.from(token, 'ascii') : DECOY;
    const same = timingSafeEqual(given, session?.token ?? DECOY);
    if (session === undefined || !same || given === DECOY) return 'unknown';
    if (this.#now() >= session.expiresAt) return 'expired';
    if (session.uid !== uid) return 'other-vmi';
    if (session.source !== source) return 'other-source';
    return true;
  }

  // A sweep at most once a second, or when the directory moved (a VMI gone).
  #maybeSweep(): void {
    const now = this.#now();
    if (this.#revision() !== this.#sweptRevision || now - this.#sweptAt >= SWEEP_EVERY_MS) this.#sweep();
  }

  // Drops expired sessions and those of VMIs no longer in the directory.
  #sweep(): void {
    const now = this.#now();
    const revision = this.#revision();
    const moved = revision !== this.#sweptRevision;
    for (const [uid, keys] of this.#byVmi) {
      const gone = moved && !this.#held(uid);
      const live = keys.filter((k) => {
        const s = this.#byKey.get(k);
        const keep = s !== undefined && !gone && now < s.expiresAt;
        if (!keep) this.#byKey.delete(k);
        return keep;
      });
      if (live.length === 0) this.#byVmi.delete(uid);
      else this.#byVmi.set(uid, live);
    }
    this.#sweptRevision = revision;
    this.#sweptAt = now;
  }
}
