// Which VMI's seed a datasource request may read: the VMI its capability
// token was signed for (its UID, or its binding: src/datasource-binding.ts),
// or (compat mode only) the VMI reporting the caller's source address. Every miss costs the same work as a hit, so
// response time does not tell a known token from an unknown one.
import { createHash } from 'node:crypto';
import type { DatasourceRoute } from './datasource-path.ts';
import type { DatasourceKeyring } from './datasource-tokens.ts';
import type { SeedDirectory, SeedDirectoryEntry } from './datasource.ts';

const DECOY_TOKEN = 'A'.repeat(43);
const DECOY_UID = '\0vmseed-decoy';

// Index key: SHA-256 of the token, not the token. The attacker chooses the
// string being looked up but not its hash, so the Map lookup's timing says
// nothing about valid tokens; the final check is constant-time (verify()).
function indexKey(token: string): string {
  return createHash('sha256').update(token).digest('base64');
}

// Two VMIs answering to one token (a copied nonce annotation): neither is
// served, so no VMI can be handed another's seed.
const AMBIGUOUS = '';

// What a seed token may be signed over: the VMI's UID, or its binding.
function seedMessages(uid: string, entry: SeedDirectoryEntry | undefined): string[] {
  return entry?.binding === undefined ? [uid] : [uid, entry.binding];
}

// Token -> UID of the directory's VMIs, rebuilt when the directory or the
// keys change. `messagesOf` says what a VMI's tokens are signed over.
export class TokenIndex {
  #byToken = new Map<string, string>();
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

  resolve(token: string): string | undefined {
    if (this.#revision !== this.#directory.revision || this.#generation !== this.#keyring.generation) this.#rebuild();
    const uid = this.#byToken.get(indexKey(token));
    return uid === AMBIGUOUS ? undefined : uid;
  }

  #rebuild(): void {
    const next = new Map<string, string>();
    const revision = this.#directory.revision;
    const generation = this.#keyring.generation;
    const add = (token: string, uid: string) => {
      const k = indexKey(token);
      const had = next.get(k);
      next.set(k, had === undefined || had === uid ? uid : AMBIGUOUS);
    };
    for (const uid of this.#directory.listUids()) {
      for (const m of this.#messagesOf(uid, this.#directory.get(uid)))
        for (const t of this.#keyring.acceptedTokens(m)) add(t, uid);
    }
    // Only a whole index counts as built: a directory that threw is asked again.
    this.#byToken = next;
    this.#revision = revision;
    this.#generation = generation;
  }
}

export class SeedIdentity {
  readonly #directory: SeedDirectory;
  readonly #keyring: DatasourceKeyring;
  readonly #compatSourceAddress: boolean;
  readonly #index: TokenIndex;

  constructor(directory: SeedDirectory, keyring: DatasourceKeyring, compatSourceAddress: boolean) {
    this.#directory = directory;
    this.#keyring = keyring;
    this.#compatSourceAddress = compatSourceAddress;
    this.#index = new TokenIndex(directory, keyring);
  }

  // The entry whose seed this route may read, or undefined.
  lookup(route: DatasourceRoute, source: string): SeedDirectoryEntry | undefined {
    if (route.kind === 'compat') {
      return this.#compatSourceAddress ? this.#directory.byAddress(source) : undefined;
    }
    const uid = this.#index.resolve(route.token);
    if (uid === undefined) {
      this.#equalise(route.token);
      return undefined;
    }
    // The index may be stale by one VMI deletion; get() is the truth, and
    // verify() re-checks the token against the keys in force now. Both
    // forms are checked every time, so the work does not tell them apart.
    const entry = this.#directory.get(uid);
    const byUid = this.#keyring.verify(route.token, uid);
    const byBinding = this.#keyring.verify(route.token, entry?.binding ?? DECOY_UID);
    if (entry === undefined || entry.uid !== uid || !(byUid || byBinding)) return undefined;
    return entry;
  }

  // The work of a token lookup, for a path that names no route at all.
  unrouted(): void {
    this.#index.resolve(DECOY_TOKEN);
    this.#equalise(DECOY_TOKEN);
  }

  // The HMAC work a found token costs, done for misses too.
  #equalise(token: string): void {
    this.#keyring.verify(token, DECOY_UID);
    this.#keyring.verify(token, DECOY_UID);
  }
}
