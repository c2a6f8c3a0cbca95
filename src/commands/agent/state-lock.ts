// One agent per state directory: an exclusive flock(2) on
// <state-dir>/.vmseed.lock, held for the life of the process.
//
// Node has no flock. We open the file ourselves (O_NOFOLLOW: never a
// symlink someone planted; O_NONBLOCK: never stuck on a FIFO; then fstat:
// a regular file only) and let util-linux's `flock --nonblock 3` lock that
// very descriptor, passed as its fd 3. A flock belongs to the open file
// description, which the child shares with us: it stays locked after the
// child exits, for as long as this process keeps the descriptor open, and
// the kernel drops it when the process dies however it dies (SIGKILL, OOM)
// so there is never a stale lock to clean up. A PID file could not do this
// here: two agents in two pods have separate PID namespaces (both PID 1),
// so "is that PID alive?" means nothing; mkdir/mtime locks (npm's
// proper-lockfile) go stale on a crash and need a clock-based timeout.
import { spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { VmseedError } from '../../errors.ts';

export const LOCK_FILE = '.vmseed.lock';
// flock's exit status when the lock is held elsewhere (--conflict-exit-code).
const CONFLICT = 75;
const MAX_HOLDER_BYTES = 4096;

export interface StateLock {
  path: string;
  release(): Promise<void>;
}

export interface LockOptions {
  flockPath?: string; // default: flock on PATH
  timeoutMs?: number; // for the flock child; it never waits for the lock
}

export async function lockStateDir(stateDir: string, options: LockOptions = {}): Promise<StateLock> {
  const path = join(stateDir, LOCK_FILE);
  let fh: FileHandle;
  try {
    // Read-only: flock needs no write access, and a descriptor open for
    // writing would keep the filesystem from being remounted read-only.
    fh = await open(path, constants.O_RDONLY | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NONBLOCK, 0o640);
  } catch (e) {
    const c = (e as NodeJS.ErrnoException).code;
    throw new VmseedError(
      'STATE_LOCK_FAILED',
      c === 'ELOOP'
        ? `${path} is a symlink; vmseed will not lock through it: remove it (the agent creates its own)`
        : `cannot open the lock file ${path} (${c ?? 'error'}); make --state-dir writable by the agent`,
      { kind: 'terminal', field: 'state-dir', cause: e },
    );
  }
  try {
    if (!(await fh.stat()).isFile()) {
      throw new VmseedError(
        'STATE_LOCK_FAILED',
        `${path} is not a regular file; remove it (the agent creates its own)`,
        { kind: 'terminal', field: 'state-dir' },
      );
    }
    const status = await runFlock(fh.fd, options);
    if (status === CONFLICT) {
      const holder = await readHolder(fh);
      throw new VmseedError(
        'STATE_DIR_LOCKED',
        `another vmseed agent is using ${stateDir}${holder ? ` (${holder})` : ''}: run one agent per state directory, or give this one its own --state-dir`,
        { kind: 'terminal', field: 'state-dir' },
      );
    }
    if (status !== 0) {
      throw new VmseedError('STATE_LOCK_FAILED', `flock ${path} failed (${status}); is util-linux's flock installed?`, {
        kind: 'terminal',
        field: 'state-dir',
      });
    }
    // Ours now: say whose it is, for the next one's message (through a
    // short-lived descriptor of the same checked file).
    const w = await open(path, constants.O_WRONLY | constants.O_TRUNC | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      const [a, b] = [await fh.stat(), await w.stat()];
      if (a.ino !== b.ino || a.dev !== b.dev)
        throw new VmseedError(
          'STATE_LOCK_FAILED',
          `${path} was replaced while being locked; is another process managing it?`,
          { kind: 'terminal', field: 'state-dir' },
        );
      await w.write(`pid ${process.pid} on ${hostname()} since ${new Date().toISOString()}\n`);
    } finally {
      await w.close();
    }
  } catch (e) {
    await fh.close();
    throw e;
  }
  return {
    path,
    // Closing the descriptor drops the lock (the flock child is long gone).
    release: () => fh.close(),
  };
}

function runFlock(fd: number, options: LockOptions): Promise<number | string> {
  return new Promise((resolve) => {
    const child = spawn(
      options.flockPath ?? 'flock',
      ['--nonblock', '--exclusive', '--conflict-exit-code', String(CONFLICT), '3'],
      {
        stdio: ['ignore', 'ignore', 'pipe', fd],
        timeout: options.timeoutMs ?? 10_000,
      },
    );
    let err = '';
    child.stderr!.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-500)));
    child.on('error', (e: NodeJS.ErrnoException) =>
      resolve(e.code === 'ENOENT' ? `${options.flockPath ?? 'flock'} not found` : e.message),
    );
    child.on('close', (code, signal) => resolve(code ?? `killed by ${signal}${err ? `: ${err.trim()}` : ''}`));
  });
}

async function readHolder(fh: FileHandle): Promise<string | undefined> {
  const buf = Buffer.alloc(MAX_HOLDER_BYTES);
  const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
  // Our own line format only: the file is in a directory others may write.
  const line = buf.subarray(0, bytesRead).toString('utf8').split('\n')[0];
  return /^pid \d{1,10} on [A-Za-z0-9._-]{1,253} since [0-9T:.Z-]{10,30}$/.test(line) ? line : undefined;
}
