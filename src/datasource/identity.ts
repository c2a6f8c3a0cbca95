// Which VMI's seed a datasource request may read: the VMI its capability
// token was signed for (its UID, or its binding: src/datasource/binding.ts),
// or (compat mode only) the VMI at the caller's source address. Where the
// directory ties addresses to launcher pods (SeedDirectory.launcherAt), a
// token is no bearer credential: it opens its VMI's seed only from that
// VMI's launcher pod's address, because the token sits in the VMI's spec
// (firmware serial), which every namespace viewer can read. Every
// miss costs the same work as a hit, so response time does not tell a known
// token from an unknown one.
//
// No HMAC is computed per request: the index holds every token the keys in
// force accept for the directory's VMIs, with the message each is signed
// over, rebuilt whenever the keys or the directory's revision move. A
// request costs one hash, one lookup and one constant-time compare, which
// keeps a flooding guest's refusals cheap for the node's other guests.
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

// A token the keys accept, the VMI it opens, and what it is signed over (the
// UID or the VMI's binding at the time the index was built).
export interface TokenGrant {
  uid: string;
  message: string;
  token: Buffer;
}

// Two VMIs answering to one token (a copied nonce annotation): neither is
// served, so no VMI can be handed another's seed.
const AMBIGUOUS = null;

// What a seed token may be signed over: the VMI's UID, or its binding.
function seedMessages(uid: string, entry: SeedDirectoryEntry | undefined): string[] {
  return entry?.binding === undefined ? [uid] : [uid, entry.binding];
}

/**
 * Token -> UID of the directory's VMIs, rebuilt when the directory or the
 * keys change. `messagesOf` says what a VMI's tokens are signed over. Its
 * size is bounded by the directory's: keys x messages per VMI; tokens that
 * verify nothing are never added.
 */
export class TokenIndex {
  #byToken = new Map<string, TokenGrant | typeof AMBIGUOUS>();
  #revision: number | undefined;
  #generation: number | undefined;
  readonly #directory: SeedDirectory;
  readonly #keyring: DatasourceKeyring;
  readonly #messagesOf: (uid: string, entry: SeedDirectoryEntry | undefined) => string[];

  constructor(
    directory: SeedDirectory,
    keyring: DatasourceKeyring,
    messagesOf: (uid: string, entry: SeedDirectoryEntry | undefined) => string[] = seedMessages,
  ) {
    this.#directory = directory;
    this.#keyring = keyring;
    this.#messagesOf = messagesOf;
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
    return this.#byToken.get(indexKey(token)) ?? undefined;
  }

  #rebuild(): void {
    const next = new Map<string, TokenGrant | typeof AMBIGUOUS>();
    const revision = this.#directory.revision;
    const generation = this.#keyring.generation;
    const add = (token: string, uid: string, message: string) => {
      const k = indexKey(token);
      const had = next.get(k);
      if (had === undefined) next.set(k, { uid, message, token: Buffer.from(token, 'ascii') });
      else if (had !== AMBIGUOUS && had.uid !== uid) next.set(k, AMBIGUOUS);
    };
    for (const uid of this.#directory.listUids()) {
      for (const m of this.#messagesOf(uid, this.#directory.get(uid)))
        for (const t of this.#keyring.acceptedTokens(m)) add(t, uid, m);
    }
    // Only a whole index counts as built: a directory that threw is asked again.
    this.#byToken = next;
    this.#revision = revision;
    this.#generation = generation;
  }
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
    const grant = this.#index.verified(route.token);
    if (grant === undefined) return undefined;
    // The index may be stale by one VMI deletion or binding change; get() is
    // the truth.
    const entry = this.#directory.get(grant.uid);
    if (entry === undefined || entry.uid !== grant.uid) return undefined;
    if (!fromLauncherOf(this.#directory, grant.uid, source)) return undefined;
    return grant.message === grant.uid || grant.message === entry.binding ? entry : undefined;
  }

  // The work of a token lookup, for a path that names no route at all.
  unrouted(): void {
    this.#index.verified(DECOY_TOKEN);
  }
}
