// Fixture cache: <root>/<name>-<hash of inputs>/, built once and shared by
// every test process. A build happens in a private temporary directory that is
// renamed into place when complete, so readers never see a partial fixture; a
// lock file (holding the builder's pid) makes concurrent processes wait for
// the first builder instead of repeating a multi-minute build. A stale lock
// (builder died) is taken over.
import { createHash } from 'node:crypto';
import { chmod, mkdir, mkdtemp, open, readFile, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export function fixtureCacheRoot(): string {
  return process.env.VMSEED_FIXTURE_CACHE || '/var/cache/vmseed-fixtures';
}

/** Stable hash of the inputs that determine a fixture's bytes. */
export function inputsHash(inputs: Record<string, unknown>): string {
  const canonical = JSON.stringify(inputs, Object.keys(inputs).sort());
  return createHash('sha256').update(canonical).digest('hex').slice(0, 16);
}

const COMPLETE = '.complete';

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}

function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function tryLock(lockPath: string): Promise<boolean> {
  try {
    const fh = await open(lockPath, 'wx');
    await fh.writeFile(String(process.pid));
    await fh.close();
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    const holder = Number((await readFile(lockPath, 'utf8').catch(() => '')).trim());
    // An empty file is normally a lock being written right now; it is stale
    // only if it stayed empty (its writer died between open and write).
    const emptyAgeMs = holder ? 0 : Date.now() - ((await stat(lockPath).catch(() => undefined))?.mtimeMs ?? Date.now());
    if ((holder && !pidAlive(holder)) || emptyAgeMs > 10_000) {
      await unlink(lockPath).catch(() => {});
    }
    return false;
  }
}

/**
 * Returns the directory of fixture `name` for `inputs`, running `build(tmpDir)`
 * only when no complete copy exists. `build` fills tmpDir; it is renamed into
 * place afterwards.
 */
export async function cachedFixture(
  name: string,
  inputs: Record<string, unknown>,
  build: (dir: string) => Promise<void>,
  opts: { lockWaitMs?: number } = {},
): Promise<{ dir: string; built: boolean; key: string }> {
  const root = fixtureCacheRoot();
  await mkdir(root, { recursive: true });
  const key = `${name}-${inputsHash(inputs)}`;
  const dir = path.join(root, key);
  const lockPath = path.join(root, `${key}.lock`);
  const deadline = Date.now() + (opts.lockWaitMs ?? 15 * 60_000);
  for (;;) {
    if (await exists(path.join(dir, COMPLETE))) return { dir, built: false, key };
    if (await tryLock(lockPath)) break;
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for another process building fixture ${key} (lock ${lockPath})`);
    await sleep(300);
  }
  try {
    // Re-check under the lock: the previous holder may just have finished.
    if (await exists(path.join(dir, COMPLETE))) return { dir, built: false, key };
    const tmp = await mkdtemp(path.join(root, `.tmp-${key}-`));
    try {
      await chmod(tmp, 0o755); // mkdtemp makes 0700; QEMU may run as another user
      await build(tmp);
      await writeFile(path.join(tmp, 'inputs.json'), JSON.stringify(inputs, null, 2) + '\n');
      await writeFile(path.join(tmp, COMPLETE), new Date().toISOString() + '\n');
      // A leftover incomplete dir (crash between rename and marker cannot
      // happen, but a manual copy might) is replaced.
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
    } catch (e) {
      await rm(tmp, { recursive: true, force: true });
      throw e;
    }
    return { dir, built: true, key };
  } finally {
    await unlink(lockPath).catch(() => {});
  }
}
