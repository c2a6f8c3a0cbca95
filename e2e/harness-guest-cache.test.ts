// Harness test (of the test fixtures, not of vmseed).
// The fixture cache under concurrency: several processes asking for the same
// fixture build it once and all get the complete directory; a lock left by a
// dead builder is taken over; a failed build leaves nothing behind.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { cachedFixture, inputsHash } from './support/guest/cache.ts';

const execFileP = promisify(execFile);
const cacheModule = new URL('./support/guest/cache.ts', import.meta.url).href;

// A child process that builds fixture "demo" slowly and records each build.
const CHILD = `
import { appendFile, writeFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
const { cachedFixture } = await import(process.argv[1]);
const r = await cachedFixture('demo', { v: 1 }, async (dir) => {
  await appendFile(process.argv[2], process.pid + '\\n');
  await sleep(500);
  await writeFile(dir + '/payload', 'built by ' + process.pid);
});
process.stdout.write(r.dir);
`;

test('harness: concurrent processes build a fixture once and all see the complete copy', async () => {
  const root = await mkdtemp(path.join(tmpdir(), 'vmseed-cache-test-'));
  try {
    const log = path.join(root, 'builds.log');
    await writeFile(log, '');
    const env = { ...process.env, VMSEED_FIXTURE_CACHE: path.join(root, 'cache') };
    const runs = await Promise.all(
      [0, 1, 2, 3].map(() =>
        execFileP(process.execPath, ['--input-type=module', '-e', CHILD, cacheModule, log], { env, timeout: 60_000 }),
      ),
    );
    const dirs = new Set(runs.map((r) => r.stdout));
    assert.equal(dirs.size, 1);
    const [dir] = dirs;
    const builders = (await readFile(log, 'utf8')).trim().split('\n');
    assert.equal(builders.length, 1, 'exactly one build');
    assert.equal(await readFile(path.join(dir, 'payload'), 'utf8'), `built by ${builders[0]}`);
    // Only the fixture itself remains: no temporary build dirs, no lock.
    assert.deepEqual(await readdir(path.join(root, 'cache')), [path.basename(dir)]);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('harness: a lock left by a dead builder is taken over; a failed build leaves no directory', async () => {
  const root = await mkdtemp(path.join(tmpdir(), 'vmseed-cache-test-'));
  const saved = process.env.VMSEED_FIXTURE_CACHE;
  process.env.VMSEED_FIXTURE_CACHE = root;
  try {
    const key = `stale-${inputsHash({ v: 2 })}`;
    // pid 2^22+1 is above Linux's pid_max ceiling, so it cannot be alive.
    await writeFile(path.join(root, `${key}.lock`), String(4194305));
    const r = await cachedFixture('stale', { v: 2 }, async (dir) => writeFile(path.join(dir, 'x'), 'ok'));
    assert.equal(r.built, true);
    assert.equal(r.key, key);
    assert.equal((await cachedFixture('stale', { v: 2 }, async () => assert.fail('rebuilt'))).built, false);

    await assert.rejects(
      cachedFixture('broken', { v: 3 }, async () => {
        throw new Error('boom');
      }),
      /boom/,
    );
    assert.deepEqual((await readdir(root)).sort(), [key]);
  } finally {
    if (saved === undefined) delete process.env.VMSEED_FIXTURE_CACHE;
    else process.env.VMSEED_FIXTURE_CACHE = saved;
    await rm(root, { recursive: true, force: true });
  }
});
