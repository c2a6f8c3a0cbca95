// Per-VMI capability tokens for the NoCloud HTTP datasource, 43 base64url
// characters, no padding: URL-safe and free of `;`, `=` and whitespace,
// which cloud-init's `ds=nocloud;s=...` line parser would split on. Two kinds:
//  - serial tokens: 32 random bytes (randomToken), minted by the admission
//    webhook (or `vmseed seed-url --new-token`) and kept in the VMI's own
//    spec.domain.firmware.serial; the agent accepts one for the VMI whose
//    serial carries it (src/datasource/identity.ts). No key makes them.
//  - UID tokens: base64url(HMAC-SHA256(key, VMI UID)) under the node's own
//    key (`vmseed seed-url --uid`, plain libvirt), and the report tokens
//    (src/datasource/reports/report-token.ts). The UID alone is not enough
//    because the key never leaves the node; each node has its own
//    (--datasource-key-create makes it).
//
// Rotation without downtime: the key file lists the signing key first and
// any number of still-accepted keys after it. Deploy `new\nold`, re-point
// the VMIs' serials at their new URLs at leisure, then drop `old`.
import { createHash, createHmac, createSecretKey, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto';
import { constants } from 'node:fs';
import { link, open, readFile, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { VmseedError } from '../errors.ts';
import { challengeAnswer, MAX_ANSWERS } from '../redirect/challenge.ts';

/** Characters in every token: an HMAC-SHA256 in base64url, unpadded. */
export const TOKEN_LENGTH = 43;
export const MIN_KEY_BYTES = 32;
const TOKEN_RE = /^[A-Za-z0-9_-]{43}$/;

/**
 * Where key material comes from (a mounted Secret in production, a string
 * in tests). Returns the raw file text; parsing and checks are ours.
 */
export interface KeySource {
  read(): Promise<string>;
  // For messages only: never the content.
  readonly description: string;
}

/**
 * A KeySource reading `path`. read() throws VmseedError
 * DATASOURCE_KEY_FILE_UNREADABLE (retryable) when the file cannot be read.
 */
export function fileKeySource(path: string): KeySource {
  return {
    description: path,
    async read() {
      try {
        return await readFile(path, 'utf8');
      } catch (e) {
        throw new VmseedError(
          'DATASOURCE_KEY_FILE_UNREADABLE',
          `cannot read the datasource key file ${path} (${(e as NodeJS.ErrnoException).code ?? 'error'}); mount the Secret there or fix --datasource-key-file`,
          { kind: 'retryable', field: 'datasourceKeyFile', cause: e },
        );
      }
    },
  };
}

/**
 * One key per line, base64 or base64url (what `openssl rand -base64 32`
 * prints). Blank lines and `#` comments are skipped. The first key signs.
 * Weak keys are refused: fewer than 32 bytes, or so few distinct byte values
 * that they cannot be random (all zeros, a repeated pattern). Throws
 * VmseedError DATASOURCE_KEY_INVALID; messages name the line, never the key.
 */
export function parseKeyFile(text: string, where = 'key file'): Uint8Array[] {
  const keys: Uint8Array[] = [];
  const seen = new Set<string>();
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === '' || line.startsWith('#')) continue;
    const field = `${where}:${i + 1}`;
    if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(line)) {
      throw new VmseedError(
        'DATASOURCE_KEY_INVALID',
        `datasource key on line ${i + 1} of ${where} is not base64; generate one with 'openssl rand -base64 32'`,
        { field },
      );
    }
    const key = Buffer.from(line.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
    if (key.length < MIN_KEY_BYTES) {
      throw new VmseedError(
        'DATASOURCE_KEY_INVALID',
        `datasource key on line ${i + 1} of ${where} has ${key.length} bytes, at least ${MIN_KEY_BYTES} are required; generate one with 'openssl rand -base64 32'`,
        { field },
      );
    }
    if (new Set(key).size < 16) {
      throw new VmseedError(
        'DATASOURCE_KEY_INVALID',
        `datasource key on line ${i + 1} of ${where} is not random (too few distinct bytes); generate one with 'openssl rand -base64 32'`,
        { field },
      );
    }
    const id = key.toString('hex');
    if (seen.has(id)) continue;
    seen.add(id);
    keys.push(new Uint8Array(key));
  }
  if (keys.length === 0) {
    throw new VmseedError(
      'DATASOURCE_KEY_INVALID',
      `${where} holds no key; put one base64 key per line, the signing key first`,
      { field: where },
    );
  }
  return keys;
}

export function signToken(key: Uint8Array | KeyObject, uid: string): string {
  return createHmac('sha256', key).update(uid, 'utf8').digest('base64url');
}

/** A fresh serial token: 32 random bytes, base64url (TOKEN_LENGTH characters). */
export function randomToken(): string {
  return randomBytes(32).toString('base64url');
}

/** Whether `s` has a token's form (43 base64url characters); says nothing of its validity. */
export function isTokenShaped(s: string): boolean {
  return TOKEN_RE.test(s);
}

/**
 * The datasource keys in force: the first signs, every one verifies.
 * replace() and reload() swap them atomically (a bad set throws VmseedError
 * DATASOURCE_KEY_INVALID and leaves the old keys) and bump `generation`.
 */
export class DatasourceKeyring {
  #keys: Uint8Array[] = [];
  // The same keys as KeyObjects: an HMAC over a raw key pays for turning it
  // into one on every call.
  #hmacKeys: KeyObject[] = [];
  #generation = 0;

  constructor(keys: readonly Uint8Array[]) {
    this.replace(keys);
  }

  // No key yet: the key file was missing at start-up (its optional Secret
  // not created yet). Nothing verifies and nothing is signed until a
  // reload() brings keys.
  static empty(): DatasourceKeyring {
    const ring = new DatasourceKeyring([new Uint8Array(MIN_KEY_BYTES)]);
    ring.#keys = [];
    ring.#hmacKeys = [];
    return ring;
  }

  static async load(source: KeySource): Promise<DatasourceKeyring> {
    return new DatasourceKeyring(parseKeyFile(await source.read(), source.description));
  }

  // Bumped on every key change, so holders of derived state (the server's
  // token index) know to rebuild it.
  get generation(): number {
    return this.#generation;
  }

  get size(): number {
    return this.#keys.length;
  }

  // Atomic: on a bad file the old keys stay in force and the error is thrown.
  async reload(source: KeySource): Promise<void> {
    this.replace(parseKeyFile(await source.read(), source.description));
  }

  replace(keys: readonly Uint8Array[]): void {
    if (keys.length === 0)
      throw new VmseedError('DATASOURCE_KEY_INVALID', 'the datasource keyring needs at least one key');
    for (const k of keys) {
      if (k.length < MIN_KEY_BYTES) {
        throw new VmseedError(
          'DATASOURCE_KEY_INVALID',
          `a datasource key has ${k.length} bytes, at least ${MIN_KEY_BYTES} are required`,
        );
      }
    }
    this.#keys = keys.map((k) => new Uint8Array(k));
    this.#hmacKeys = this.#keys.map((k) => createSecretKey(k));
    this.#generation++;
  }

  // The token a VMI should be given now (signing key). `uid` is a VMI's UID
  // or a message of its own (a report token's).
  sign(uid: string): string {
    if (this.#keys.length === 0)
      throw new VmseedError('DATASOURCE_KEY_FILE_UNREADABLE', 'no datasource key is loaded yet; nothing can be signed');
    return signToken(this.#hmacKeys[0], uid);
  }

  // Every token accepted for this UID: one per key, signing key first.
  acceptedTokens(uid: string): string[] {
    return this.#hmacKeys.map((k) => signToken(k, uid));
  }

  // Constant time in the token's content: every key is tried, and the
  // comparison is timingSafeEqual on equal-length buffers.
  verify(token: string, uid: string): boolean {
    if (!isTokenShaped(token)) return false;
    const given = Buffer.from(token, 'ascii');
    let ok = false;
    for (const k of this.#hmacKeys) {
      const want = Buffer.from(signToken(k, uid), 'ascii');
      if (timingSafeEqual(given, want)) ok = true;
    }
    return ok;
  }

  // The redirect challenge's answers (redirect/challenge.ts), one per key.
  challengeAnswers(nonce: string): string[] {
    return this.#keys.slice(0, MAX_ANSWERS).map((k) => challengeAnswer(k, nonce));
  }

  // Short, non-reversible identifiers of the keys, for the status page and
  // logs ("which key is signing?") without exposing key material.
  fingerprints(): string[] {
    return this.#keys.map((k) => createHash('sha256').update(k).digest('hex').slice(0, 12));
  }
}

/**
 * Creates the key file `path` with one fresh random key (32 bytes, base64,
 * one line) unless it exists. Atomic: the key is written to a temporary
 * file in the same directory (O_EXCL, mode 0640: the group, the agent pod's, lets its redirect container check the challenge), synced, then linked to
 * `path`; when another process made `path` first, theirs stays and this
 * one's is discarded. Returns whether this call created it. The directory
 * must exist. Throws VmseedError DATASOURCE_KEY_FILE_UNREADABLE when the
 * file cannot be made.
 */
export async function createKeyFileIfMissing(path: string): Promise<boolean> {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);
  const fail = (e: unknown): never => {
    throw new VmseedError(
      'DATASOURCE_KEY_FILE_UNREADABLE',
      `cannot create the datasource key file ${path} (${(e as NodeJS.ErrnoException).code ?? 'error'}); its directory must exist and be writable`,
      { kind: 'retryable', field: 'datasourceKeyFile', cause: e },
    );
  };
  try {
    await readFile(path);
    return false;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') fail(e);
  }
  try {
    const fh = await open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o640);
    try {
      await fh.writeFile(`${randomBytes(MIN_KEY_BYTES).toString('base64')}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      // link() fails with EEXIST where rename() would replace: whoever came
      // first keeps the file, and every process then reads the same key.
      await link(tmp, path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'EEXIST') return false;
      throw e;
    }
    await syncDirectory(dirname(path));
    return true;
  } catch (e) {
    return fail(e);
  } finally {
    await unlink(tmp).catch(() => undefined);
  }
}

async function syncDirectory(dir: string): Promise<void> {
  const fh = await open(dir, constants.O_RDONLY);
  try {
    await fh.sync();
  } catch {
    // Some filesystems refuse fsync on a directory; the link is made.
  } finally {
    await fh.close();
  }
}
