// The webhook's serving certificate: `tls.crt` and `tls.key` in a directory
// (a kubernetes.io/tls Secret, cert-manager's or one made by hand), loaded
// at start and again whenever they change, so a rotated certificate is
// served without a restart. A Secret volume updates by swapping its `..data`
// symlink, so the directory is watched, with a poll for what a watch misses.
// A pair that does not load (missing, half-written, key not matching) keeps
// the one in force; what is wrong is kept for /readyz.
import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { X509Certificate } from 'node:crypto';
import type { Logger } from 'pino';

export const CERT_FILE = 'tls.crt';
export const KEY_FILE = 'tls.key';
// A PEM chain and key are a few KiB; a file far larger is not one.
const MAX_PEM_BYTES = 256 * 1024;

export interface CertPair {
  cert: Buffer;
  key: Buffer;
  notBefore: Date;
  notAfter: Date;
}

export interface CertDirOptions {
  dir: string;
  logger: Logger;
  // The certificate went into force (first load or a rotation).
  onLoad: (pair: CertPair) => void;
  pollMs?: number;
  debounceMs?: number;
  now?: () => Date;
}

async function readPem(path: string): Promise<Buffer> {
  const data = await readFile(path);
  if (data.length > MAX_PEM_BYTES) throw new Error(`${path} is ${data.length} bytes, not a PEM file`);
  return data;
}

// Reads and checks the pair; throws an Error whose message names the file
// and what is wrong, never the content.
export async function readCertPair(dir: string): Promise<CertPair> {
  const certPath = join(dir, CERT_FILE);
  const keyPath = join(dir, KEY_FILE);
  let cert: Buffer;
  let key: Buffer;
  try {
    [cert, key] = await Promise.all([readPem(certPath), readPem(keyPath)]);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT')
      throw new Error(`webhook certificate missing: ${certPath} or ${keyPath} does not exist`, { cause: e });
    throw new Error(`webhook certificate unreadable in ${dir}: ${code ?? (e as Error).message}`, { cause: e });
  }
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(cert);
    createSecureContext({ cert, key });
  } catch (e) {
    throw new Error(
      `webhook certificate in ${dir} is not a usable PEM certificate and key pair: ${(e as Error).message}`,
      { cause: e },
    );
  }
  return { cert, key, notBefore: new Date(x509.validFrom), notAfter: new Date(x509.validTo) };
}

/**
 * Runs `load` one at a time (a call during a run triggers one more) and,
 * once started, when `dir` changes (debounced) and every `pollMs`. A
 * directory that cannot be watched (missing: an optional Secret not there
 * yet) is polled for. `what` names the files in the log.
 */
export class Reloader {
  readonly #o: {
    dir: string;
    what: string;
    logger: Logger;
    load: () => Promise<void>;
    pollMs?: number;
    debounceMs?: number;
  };
  #running: Promise<void> | undefined;
  #again = false;
  #watcher: FSWatcher | undefined;
  #poll: NodeJS.Timeout | undefined;
  #debounce: NodeJS.Timeout | undefined;

  constructor(options: {
    dir: string;
    what: string;
    logger: Logger;
    load: () => Promise<void>;
    pollMs?: number;
    debounceMs?: number;
  }) {
    this.#o = options;
  }

  check(): Promise<void> {
    if (this.#running) {
      this.#again = true;
      return this.#running;
    }
    this.#running = this.#o.load().finally(() => {
      this.#running = undefined;
      if (this.#again) {
        this.#again = false;
        void this.check();
      }
    });
    return this.#running;
  }

  start(): void {
    const { what, logger } = this.#o;
    try {
      this.#watcher = watch(this.#o.dir, { persistent: false }, () => {
        if (this.#debounce) clearTimeout(this.#debounce);
        this.#debounce = setTimeout(() => void this.check(), this.#o.debounceMs ?? 100);
        this.#debounce.unref();
      });
      this.#watcher.on('error', (e) =>
        logger.warn({ err: { message: e.message } }, `${what} watch failed; polling only`),
      );
    } catch (e) {
      logger.warn({ err: { message: (e as Error).message } }, `cannot watch the ${what} directory; polling only`);
    }
    this.#poll = setInterval(() => void this.check(), this.#o.pollMs ?? 30_000);
    this.#poll.unref();
  }

  stop(): void {
    this.#watcher?.close();
    if (this.#poll) clearInterval(this.#poll);
    if (this.#debounce) clearTimeout(this.#debounce);
  }
}

/**
 * A certificate directory kept loaded: check() reads the pair now, start()
 * watches and polls, problem() says why it cannot serve (for /readyz).
 */
export class CertDir {
  readonly #o: CertDirOptions;
  readonly #reloader: Reloader;
  #pair: CertPair | undefined;
  #failure: string | undefined;

  constructor(options: CertDirOptions) {
    this.#o = options;
    this.#reloader = new Reloader({
      dir: options.dir,
      what: 'webhook certificate',
      logger: options.logger,
      load: () => this.#once(),
      ...(options.pollMs !== undefined ? { pollMs: options.pollMs } : {}),
      ...(options.debounceMs !== undefined ? { debounceMs: options.debounceMs } : {}),
    });
  }

  get pair(): CertPair | undefined {
    return this.#pair;
  }

  // Why the webhook cannot serve now, or undefined.
  problem(): string | undefined {
    const now = (this.#o.now ?? (() => new Date()))();
    if (this.#pair === undefined) return this.#failure ?? 'webhook certificate not loaded yet';
    if (now > this.#pair.notAfter)
      return `webhook certificate in ${this.#o.dir} expired at ${this.#pair.notAfter.toISOString()}${this.#failure ? `; ${this.#failure}` : ''}`;
    if (now < this.#pair.notBefore)
      return `webhook certificate in ${this.#o.dir} is not valid before ${this.#pair.notBefore.toISOString()}`;
    return undefined;
  }

  // Loads the pair now; one read at a time, a change during one triggers
  // one more.
  check(): Promise<void> {
    return this.#reloader.check();
  }

  async #once(): Promise<void> {
    let pair: CertPair;
    try {
      pair = await readCertPair(this.#o.dir);
    } catch (e) {
      const message = (e as Error).message;
      if (message !== this.#failure) this.#o.logger.warn(`${message}; keeping the certificate in force, if any`);
      this.#failure = message;
      return;
    }
    this.#failure = undefined;
    const old = this.#pair;
    if (old && old.cert.equals(pair.cert) && old.key.equals(pair.key)) return;
    this.#pair = pair;
    this.#o.onLoad(pair);
    this.#o.logger.info(
      { dir: this.#o.dir, notAfter: pair.notAfter.toISOString() },
      old ? 'webhook certificate reloaded' : 'webhook certificate loaded',
    );
  }

  // Watches the directory and polls; the first check() is the caller's.
  start(): void {
    this.#reloader.start();
  }

  stop(): void {
    this.#reloader.stop();
  }
}
