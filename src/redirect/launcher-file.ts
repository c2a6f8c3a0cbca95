// The one thing the agent tells the redirect container: this node's launcher
// pod addresses, the only sources whose 169.254.169.254 is redirected. A
// file in a directory both containers mount (an emptyDir): one IPv4 address
// a line, written whole to a temporary name and renamed over the file, so
// the reader sees the old list or the new one, never half of one. The
// reader takes only IPv4 lines and at most MAX_LAUNCHERS of them; a missing
// file is an empty list (no VM redirected, no other pod touched).
import { constants } from 'node:fs';
import { open, rename, writeFile, unlink } from 'node:fs/promises';
import { isIPv4 } from 'node:net';
import { dirname, join } from 'node:path';

/** The file's name in the shared directory. */
export const LAUNCHER_FILE_NAME = 'launcher-addresses';
/** Addresses read at most (a node runs a few hundred pods at most). */
export const MAX_LAUNCHERS = 4096;
const MAX_BYTES = MAX_LAUNCHERS * 16;

/** The file's text for `addresses`: IPv4 ones only, sorted, deduplicated. */
export function launcherFileText(addresses: Iterable<string>): string {
  const unique = [...new Set([...addresses].filter((a) => isIPv4(a)))].sort().slice(0, MAX_LAUNCHERS);
  return unique.map((a) => `${a}\n`).join('');
}

/**
 * The addresses in the file, sorted; [] when it is missing. Lines that are
 * not IPv4 addresses are skipped (`skipped` counts them). Throws on other
 * read errors.
 */
export async function readLauncherFile(path: string): Promise<{ addresses: string[]; skipped: number }> {
  let text: string;
  try {
    text = await readBounded(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { addresses: [], skipped: 0 };
    throw e;
  }
  const lines = text.split('\n').map((l) => l.trim());
  const good = lines.filter((l) => isIPv4(l));
  const skipped = lines.filter((l) => l !== '' && !isIPv4(l)).length;
  return { addresses: [...new Set(good)].sort().slice(0, MAX_LAUNCHERS), skipped };
}

// At most MAX_BYTES of a regular file, read without following a symlink
// and without blocking on a FIFO: the directory is shared with another
// container, so the reader's cost must not depend on what stands there.
async function readBounded(path: string): Promise<string> {
  const fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    if (!(await fh.stat()).isFile())
      throw Object.assign(new Error(`${path} is not a regular file`), { code: 'EINVAL' });
    const buf = Buffer.alloc(MAX_BYTES);
    let got = 0;
    while (got < MAX_BYTES) {
      const { bytesRead } = await fh.read(buf, got, MAX_BYTES - got, got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return buf.subarray(0, got).toString('utf8');
  } finally {
    await fh.close();
  }
}

/**
 * Writes `addresses` to `path` atomically (a temporary file beside it,
 * renamed over it); world-readable, as the redirect container runs as
 * another user.
 */
export async function writeLauncherFile(path: string, addresses: Iterable<string>): Promise<void> {
  const tmp = join(dirname(path), `.${LAUNCHER_FILE_NAME}.${process.pid}.tmp`);
  try {
    await writeFile(tmp, launcherFileText(addresses), { mode: 0o644 });
    await rename(tmp, path);
  } catch (e) {
    await unlink(tmp).catch(() => {});
    throw e;
  }
}

/**
 * The agent's side: writes `launcherAddresses()` to `path` when it differs
 * from what was last written, checked every `intervalMs` (default 1 s) and
 * whenever poke() is called; a failed write is retried at the next check.
 */
export class LauncherFileWriter {
  readonly #path: string;
  readonly #source: () => Iterable<string>;
  readonly #onError: (e: Error) => void;
  readonly #timer: NodeJS.Timeout;
  #written: string | undefined;
  #busy: Promise<void> | undefined;
  #again = false;

  constructor(options: {
    path: string;
    launcherAddresses: () => Iterable<string>;
    onError: (e: Error) => void;
    intervalMs?: number;
  }) {
    this.#path = options.path;
    this.#source = options.launcherAddresses;
    this.#onError = options.onError;
    this.#timer = setInterval(() => void this.poke(), options.intervalMs ?? 1_000);
    this.#timer.unref();
    void this.poke();
  }

  /** Writes now if the addresses changed; resolves once written (or failed). */
  poke(): Promise<void> {
    if (this.#busy) {
      this.#again = true;
      return this.#busy;
    }
    this.#busy = this.#write().finally(() => {
      this.#busy = undefined;
      if (this.#again) {
        this.#again = false;
        void this.poke();
      }
    });
    return this.#busy;
  }

  async #write(): Promise<void> {
    let text: string;
    try {
      text = launcherFileText(this.#source());
      if (text === this.#written) return;
      await writeLauncherFile(this.#path, text.split('\n'));
      this.#written = text;
    } catch (e) {
      this.#onError(e as Error);
    }
  }

  /** Stops checking; the file stays (the redirect keeps the VMs it has). */
  async close(): Promise<void> {
    clearInterval(this.#timer);
    await this.#busy;
  }
}
