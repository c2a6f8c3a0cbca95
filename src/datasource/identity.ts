// Which VMI's seed a datasource request may read: the VMI whose own DMI
// serial (spec.domain.firmware.serial) carries the token, the VMI whose UID
// the token is signed over with this node's key, or (compat mode only) the
// VMI at the caller's source address. A serial token is minted at random
// (by the admission webhook or `vmseed seed-url --new-token`): no key makes
// it, it is recognised because it is in the VMI's spec. That spec is
// readable by every namespace viewer, so a token is no bearer credential:
// where the directory ties addresses to launcher pods
// (SeedDirectory.launcherAt), it opens its VMI's seed only from that VMI's
// launcher pod's address. A token several VMIs carry (a serial copied from
// a neighbour) opens, from a launcher address, the one VMI of them that
// address is; without launcher knowledge (local mode, --platform libvirt)
// it opens none of them. Every miss costs the same work as a hit, so
// response time does not tell a known token from an unknown one.
//
// No HMAC is computed per request: the index holds every token the
// directory's VMIs carry in their serials and every token the keys in force
// accept for them, with the VMIs each one opens, rebuilt whenever the keys
// or the directory's revision move. A request costs one hash, one lookup
// and one constant-time compare, which keeps a flooding guest's refusals
// cheap for the node's other guests.
import { hash, timingSafeEqual } from 'node:crypto';
import type { DatasourceRoute } from './nocloud-paths.ts';
import { TOKEN_LENGTH, isTokenShaped, type DatasourceKeyring } from './tokens.ts';
import type { SeedDirectory, SeedDirectoryEntry } from './types.ts';

const DECOY_TOKEN = 'A'.repeat(TOKEN_LENGTH);
// Compared against when a token is not in the index: NUL bytes, which no
// token-shaped string holds.
const DECOY_BYTES = Buffer.alloc(TOKEN_LENGTH, 0);

// Index key: SHA-256 of the token, not the token. The attacker chooses the
// string being looked up but not its hash, so the Map lookup's timing says
// nothing about valid tokens; the final check is constant-time.
function indexKey(token: string): string {
  return hash('sha256', token, 'base64');
}

/**
 * One VMI a token opens: signed by the keys over `message` (its UID, or a
 * message of its own such as a report token's), or, with no message, the
 * token of the VMI's own serial.
 */
export interface TokenClaim {
  uid: string;
  message?: string;
}

/** A token in the index and every VMI that claims it. */
export interface TokenGrant {
  token: Buffer;
  claims: TokenClaim[];
}

export interface TokenIndexOptions {
  // What a VMI's keyed tokens are signed over; default: its UID.
  messagesOf?: (uid: string, entry: SeedDirectoryEntry | undefined) => string[];
  // Whether the tokens of the VMIs' own serials are indexed; default true.
  serials?: boolean;
}

/**
 * Token -> the directory's VMIs it opens, rebuilt when the directory or the
 * keys change. Its size is bounded by the directory's: keys x messages per
 * VMI, plus one serial token per VMI; tokens that open nothing are never
 * added.
 */
export class TokenIndex {
  #byToken = new Map<string, TokenGrant>();
  #revision: number | undefined;
  #generation: number | undefined;
  readonly #directory: SeedDirectory;
  readonly #keyring: DatasourceKeyring;
  readonly #messagesOf: (uid: string, entry: SeedDirectoryEntry | undefined) => string[];
  readonly #serials: boolean;

  constructor(directory: SeedDirectory, keyring: DatasourceKeyring, options: TokenIndexOptions = {}) {
    this.#directory = directory;
    this.#keyring = keyring;
    this.#messagesOf = options.messagesOf ?? ((uid) => [uid]);
    this.#serials = options.serials ?? true;
  }

  get size(): number {
    return this.#byToken.size;
  }

  // The grant this exact token holds: one hash, one lookup and one
  // constant-time compare, the same work for a miss as for a hit.
  verified(token: string): TokenGrant | undefined {
    const grant = this.grant(token);
    const given = isTokenShaped(token) ? Buffer.from(token, 'ascii') : DECOY_BYTES;
    const same = timingSafeEqual(given, grant?.token ?? DECOY_BYTES);
    return grant !== undefined && same && given !== DECOY_BYTES ? grant : undefined;
  }

  // The grant whose token hashes like this one, or undefined. The caller
  // still compares the token itself (constant-time) before trusting it.
  grant(token: string): TokenGrant | undefined {
    if (this.#revision !== this.#directory.revision || this.#generation !== this.#keyring.generation) this.#rebuild();
    return this.#byToken.get(indexKey(token));
  }

  /**
   * The directory entry this token opens for a request from `source`, or
   * undefined: the claimant whose launcher address `source` is where the
   * directory knows launcher pods; the only claimant where it does not (two
   * or more: none). The entry is re-read, so an index stale by one deletion
   * or serial change answers nothing wrong.
   */
  open(token: string, source: string): SeedDirectoryEntry | undefined {
    const grant = this.verified(token);
    if (grant === undefined) return undefined;
    const claim = pickClaim(this.#directory, grant.claims, source);
    if (claim === undefined) return undefined;
    const entry = this.#directory.get(claim.uid);
    if (entry === undefined || entry.uid !== claim.uid) return undefined;
    if (claim.message === undefined && entry.serialToken !== token) return undefined;
    return entry;
  }

  #rebuild(): void {
    const next = new Map<string, TokenGrant>();
    const revision = this.#directory.revision;
    const generation = this.#keyring.generation;
    const add = (token: string, claim: TokenClaim) => {
      const k = indexKey(token);
      const had = next.get(k);
      if (had === undefined) next.set(k, { token: Buffer.from(token, 'ascii'), claims: [claim] });
      else if (!had.claims.some((c) => c.uid === claim.uid && c.message === claim.message)) had.claims.push(claim);
    };
    for (const uid of this.#directory.listUids()) {
      const entry = this.#directory.get(uid);
      for (const m of this.#messagesOf(uid, entry))
        for (const t of this.#keyring.acceptedTokens(m)) add(t, { uid, message: m });
      const serial = entry?.serialToken;
      if (this.#serials && serial !== undefined && isTokenShaped(serial) && entry?.uid === uid) add(serial, { uid });
    }
    // Only a whole index counts as built: a directory that threw is asked again.
    this.#byToken = next;
    this.#revision = revision;
    this.#generation = generation;
  }
}

// Which of a token's claimants a request from `source` speaks for.
function pickClaim(directory: SeedDirectory, claims: readonly TokenClaim[], source: string): TokenClaim | undefined {
  if (directory.launcherAt !== undefined) return claims.find((c) => fromLauncherOf(directory, c.uid, source));
  const uid = claims[0]?.uid;
  return claims.every((c) => c.uid === uid) ? claims[0] : undefined;
}

/**
 * Whether `source` may speak for the VMI `uid`: its current launcher pod's
 * address where the directory knows launcher pods, any address where it
 * does not (local mode, --platform libvirt).
 */
export function fromLauncherOf(directory: SeedDirectory, uid: string, source: string): boolean {
  return directory.launcherAt === undefined || directory.launcherAt(source) === uid;
}

/**
 * Which directory entry a datasource request may read: by verified token, or
 * by source address when compat mode is on. A miss costs what a hit does.
 */
export class SeedIdentity {
  readonly #directory: SeedDirectory;
  readonly #compatSourceAddress: boolean;
  readonly #index: TokenIndex;

  constructor(directory: SeedDirectory, keyring: DatasourceKeyring, compatSourceAddress: boolean) {
    this.#directory = directory;
    this.#compatSourceAddress = compatSourceAddress;
    this.#index = new TokenIndex(directory, keyring);
  }

  // The entry whose seed this route may read, or undefined.
  lookup(route: DatasourceRoute, source: string): SeedDirectoryEntry | undefined {
    if (route.kind === 'compat') {
      return this.#compatSourceAddress ? this.#directory.byAddress(source) : undefined;
    }
    return this.#index.open(route.token, source);
  }

  // The work of a token lookup, for a path that names no route at all.
  unrouted(): void {
    this.#index.verified(DECOY_TOKEN);
  }
}
