// Reloads the datasource key file when it changes, so keys rotate without
// a restart. A Secret volume updates by swapping a `..data` symlink in the
// file's directory (the file's inode never changes), so the directory is
// watched, not the file; a slow poll catches what a watch can miss
// (network filesystems, an event dropped under load). A file that fails to
// parse leaves the old keys in force: a half-written or wrong Secret must
// not lock every guest out of its seed.
import { watch, type FSWatcher } from 'node:fs';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import { asVmseedError } from '../errors.ts';
import { parseKeyFile, type DatasourceKeyring, type KeySource } from './tokens.ts';

export interface KeyFileWatcher {
  // Reads the file now and applies it when its content changed.
  check(): Promise<'unchanged' | 'reloaded' | 'failed'>;
  close(): void;
}

/**
 * Keeps `keyring` in step with the key file at `path`: watches its directory
 * (debounced, default 100 ms) and polls every `pollMs` (default 60 s). Never
 * throws: a read or parse failure is logged and the keys in force stay.
 */
export function watchKeyFile(options: {
  path: string;
  source: KeySource;
  keyring: DatasourceKeyring;
  logger: Logger;
  // Initial content the keyring was loaded from (so the first check is a no-op).
  initialText?: string;
  pollMs?: number;
  debounceMs?: number;
}): KeyFileWatcher {
  const { source, keyring, logger } = options;
  let last = options.initialText;
  let running: Promise<'unchanged' | 'reloaded' | 'failed'> | undefined;
  let again = false;
  let debounce: NodeJS.Timeout | undefined;

  async function once(): Promise<'unchanged' | 'reloaded' | 'failed'> {
    let text: string;
    try {
      text = await source.read();
    } catch (e) {
      logger.warn({ code: asVmseedError(e).code }, `${asVmseedError(e).message}; keeping the keys in force`);
      return 'failed';
    }
    if (text === last) return 'unchanged';
    try {
      keyring.replace(parseKeyFile(text, source.description));
    } catch (e) {
      const err = asVmseedError(e);
      // Remember it, so an unchanged bad file is not reported on every poll.
      last = text;
      logger.error({ code: err.code }, `datasource key file not applied, keeping the keys in force: ${err.message}`);
      return 'failed';
    }
    last = text;
    logger.info({ keys: keyring.size, signing: keyring.fingerprints()[0] }, 'datasource keys reloaded');
    return 'reloaded';
  }

  // One read at a time; a change during a read triggers one more.
  function check(): Promise<'unchanged' | 'reloaded' | 'failed'> {
    if (running) {
      again = true;
      return running;
    }
    running = once().finally(() => {
      running = undefined;
      if (again) {
        again = false;
        void check();
      }
    });
    return running;
  }

  let watcher: FSWatcher | undefined;
  try {
    watcher = watch(dirname(options.path), { persistent: false }, () => {
      if (debounce) clearTimeout(debounce);
      debounce = setTimeout(() => void check(), options.debounceMs ?? 100);
      debounce.unref();
    });
    watcher.on('error', (e) =>
      logger.warn({ err: { message: e.message } }, 'datasource key file watch failed; polling only'),
    );
  } catch (e) {
    logger.warn(
      { err: { message: (e as Error).message } },
      'cannot watch the datasource key file directory; polling only',
    );
  }
  const poll = setInterval(() => void check(), options.pollMs ?? 60_000);
  poll.unref();

  return {
    check,
    close() {
      watcher?.close();
      clearInterval(poll);
      if (debounce) clearTimeout(debounce);
    },
  };
}
