// The CA that signs the API server's webhook client certificate
// (--webhook-client-ca): a PEM bundle of one or more certificates, in a
// ConfigMap or Secret volume or a plain file. Loaded at start and again
// whenever its directory changes, as the serving certificate is (certs.ts).
// A file that does not load keeps the bundle in force; while none is, the
// webhook completes no handshake and /readyz says why, naming the flag.
// The optional names (--webhook-client-names) are checked once a handshake
// has verified the chain: the client certificate's subject CN or one of its
// DNS names must be one of them.
import { readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { createSecureContext, type PeerCertificate } from 'node:tls';
import { X509Certificate } from 'node:crypto';
import type { Logger } from 'pino';
import { Reloader } from './certs.ts';

export const CLIENT_CA_FLAG = '--webhook-client-ca';
// A bundle of a few CAs is a few KiB; a whole distribution's trust store
// is about 200 KiB.
const MAX_CA_BYTES = 1024 * 1024;
const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----/g;

export interface ClientCaBundle {
  pem: Buffer;
  certificates: number;
  // The latest notAfter among the bundle's certificates.
  notAfter: Date;
}

// Reads and checks the bundle; throws an Error whose message names the file
// and the flag and what is wrong, never the content.
export async function readClientCa(file: string): Promise<ClientCaBundle> {
  let pem: Buffer;
  try {
    pem = await readFile(file);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT')
      throw new Error(`webhook client CA missing: ${file} does not exist (${CLIENT_CA_FLAG})`, { cause: e });
    throw new Error(`webhook client CA unreadable: ${file} (${CLIENT_CA_FLAG}): ${code ?? (e as Error).message}`, {
      cause: e,
    });
  }
  if (pem.length > MAX_CA_BYTES)
    throw new Error(`webhook client CA ${file} (${CLIENT_CA_FLAG}) is ${pem.length} bytes, not a PEM bundle`);
  const blocks = pem.toString('latin1').match(PEM_CERTIFICATE) ?? [];
  if (blocks.length === 0) throw new Error(`webhook client CA ${file} (${CLIENT_CA_FLAG}) holds no PEM certificate`);
  let notAfter = 0;
  try {
    for (const block of blocks) notAfter = Math.max(notAfter, Date.parse(new X509Certificate(block).validTo));
    createSecureContext({ ca: pem });
  } catch (e) {
    throw new Error(
      `webhook client CA ${file} (${CLIENT_CA_FLAG}) is not a usable PEM certificate bundle: ${(e as Error).message}`,
      { cause: e },
    );
  }
  return { pem, certificates: blocks.length, notAfter: new Date(notAfter) };
}

export interface ClientCaOptions {
  file: string;
  logger: Logger;
  // A bundle went into force (first load or a change).
  onLoad: (bundle: ClientCaBundle) => void;
  pollMs?: number;
  debounceMs?: number;
  now?: () => Date;
}

/** The client CA file kept loaded, as CertDir keeps the serving pair. */
export class ClientCaFile {
  readonly #o: ClientCaOptions;
  readonly #reloader: Reloader;
  #bundle: ClientCaBundle | undefined;
  #failure: string | undefined;

  constructor(options: ClientCaOptions) {
    this.#o = options;
    this.#reloader = new Reloader({
      // A Secret or ConfigMap volume swaps its `..data` symlink: the
      // directory changes, not the file.
      dir: dirname(options.file),
      what: 'webhook client CA',
      logger: options.logger,
      load: () => this.#once(),
      ...(options.pollMs !== undefined ? { pollMs: options.pollMs } : {}),
      ...(options.debounceMs !== undefined ? { debounceMs: options.debounceMs } : {}),
    });
  }

  get bundle(): ClientCaBundle | undefined {
    return this.#bundle;
  }

  // Why no client can be authenticated now, or undefined.
  problem(): string | undefined {
    if (this.#bundle === undefined) return this.#failure ?? `webhook client CA not loaded yet (${CLIENT_CA_FLAG})`;
    const now = (this.#o.now ?? (() => new Date()))();
    if (now > this.#bundle.notAfter)
      return `webhook client CA ${this.#o.file} (${CLIENT_CA_FLAG}) expired at ${this.#bundle.notAfter.toISOString()}${this.#failure ? `; ${this.#failure}` : ''}`;
    return undefined;
  }

  check(): Promise<void> {
    return this.#reloader.check();
  }

  async #once(): Promise<void> {
    let bundle: ClientCaBundle;
    try {
      bundle = await readClientCa(this.#o.file);
    } catch (e) {
      const message = (e as Error).message;
      if (message !== this.#failure) this.#o.logger.warn(`${message}; keeping the client CA in force, if any`);
      this.#failure = message;
      return;
    }
    this.#failure = undefined;
    const old = this.#bundle;
    if (old && old.pem.equals(bundle.pem)) return;
    this.#bundle = bundle;
    this.#o.onLoad(bundle);
    this.#o.logger.info(
      { file: this.#o.file, certificates: bundle.certificates, notAfter: bundle.notAfter.toISOString() },
      old ? 'webhook client CA reloaded' : 'webhook client CA loaded',
    );
  }

  start(): void {
    this.#reloader.start();
  }

  stop(): void {
    this.#reloader.stop();
  }
}

// The names a verified client certificate goes by: its subject CNs and DNS
// subject alternative names.
export function clientNames(cert: PeerCertificate): string[] {
  const names: string[] = [];
  const cn = (cert.subject as Record<string, string | string[] | undefined> | undefined)?.CN;
  if (typeof cn === 'string') names.push(cn);
  else if (Array.isArray(cn)) names.push(...cn);
  // Node writes values with separators or quotes JSON-quoted, so a DNS
  // entry split out of another one keeps a quote and matches no name.
  for (const entry of (cert.subjectaltname ?? '').split(', '))
    if (entry.startsWith('DNS:')) names.push(entry.slice('DNS:'.length));
  return names;
}
