// bin/vmseed's compile cache and `vmseed warm-cache`: once warmed, vmseed
// starts without stripping any TypeScript (Node's stripper never loads).
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile, copyFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { COMPILE_CACHE_DEBUG, transpileTrace } from '../support/compile-cache.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const VMSEED = join(ROOT, 'bin/vmseed');

let work: string;
let cache: string;
let srcModules: string[];
before(async () => {
  work = await mkdtemp(join(tmpdir(), 'vmseed-warm-cache-'));
  cache = join(work, 'cache');
  srcModules = (await readdir(join(ROOT, 'src'), { recursive: true }))
    .filter((f) => f.endsWith('.ts'))
    .map((f) => `file://${join(ROOT, 'src', f)}`)
    .sort();
});
after(() => rm(work, { recursive: true, force: true }));

function vmseed(
  bin: string,
  args: string[],
  env: NodeJS.ProcessEnv,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(bin, args, { env: { PATH: process.env.PATH, ...env }, timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr });
    });
  });
}

test('warm-cache fills the cache; the next start loads every module of src/ from it', async () => {
  const first = await vmseed(VMSEED, ['warm-cache'], { NODE_COMPILE_CACHE: cache });
  assert.equal(first.code, 0, first.stderr);
  assert.match(
    first.stdout,
    new RegExp(`^compile cache: ${srcModules.length} modules of src/ and what they import, in ${cache}/v`),
  );
  const again = await vmseed(VMSEED, ['warm-cache'], { NODE_COMPILE_CACHE: cache, ...COMPILE_CACHE_DEBUG });
  assert.equal(again.code, 0, again.stderr);
  const trace = transpileTrace(again.stderr);
  assert.deepEqual(trace.misses, []);
  const hits = new Set(trace.hits);
  const unseen = srcModules.filter((m) => !hits.has(m));
  // What the trace said of a module it neither hit nor missed, if any.
  const said = unseen.length
    ? again.stderr
        .split('\n')
        .filter((l) => l.includes(unseen[0]))
        .join('\n')
    : '';
  assert.deepEqual(unseen, [], `the trace's lines for ${unseen[0]}:\n${said || '(none)'}`);
  assert.deepEqual([...hits].sort(), srcModules);
});

test('a cold cache is a miss for every module, which is what warm-cache prevents', async () => {
  const cold = await vmseed(VMSEED, ['--help'], { NODE_COMPILE_CACHE: join(work, 'cold'), ...COMPILE_CACHE_DEBUG });
  assert.equal(cold.code, 0, cold.stderr);
  const trace = transpileTrace(cold.stderr);
  assert.deepEqual(trace.hits, []);
  assert.ok(
    trace.misses.includes(srcModules.find((m) => m.endsWith('/src/main.ts'))!),
    'main.ts stripped on a cold start',
  );
});

test('the local-mode agent runs from the warmed cache without stripping TypeScript', async () => {
  await vmseed(VMSEED, ['warm-cache'], { NODE_COMPILE_CACHE: cache });
  const child = spawn(
    VMSEED,
    [
      'agent',
      '--local',
      join(ROOT, 'examples'),
      '--state-dir',
      join(work, 'seeds'),
      '--listen',
      '127.0.0.1:0',
      '--log-level',
      'info',
    ],
    {
      env: { PATH: process.env.PATH, NODE_COMPILE_CACHE: cache, ...COMPILE_CACHE_DEBUG },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  // The agent logs to stderr, beside Node's compile cache trace.
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  // Running means the examples were reconciled: every module the agent uses is loaded by then.
  const deadline = Date.now() + 60_000;
  while (!/"reason":"SeedReady"/.test(stderr) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  child.kill('SIGTERM');
  assert.equal(await exited, 0, stderr.slice(-2000));
  assert.match(stderr, /"reason":"SeedReady"/);
  const trace = transpileTrace(stderr);
  assert.deepEqual(trace.misses, []);
  assert.ok(
    trace.hits.some((m) => m.endsWith('/src/agent/local/local-vmi-source.ts')),
    "the agent's modules came from the cache",
  );
});

test('bin/vmseed leaves the cache off where it cannot make the directory, and vmseed still runs', async () => {
  // A copy of the launcher whose node_modules is a file: no cache directory
  // can be made there (Node given one it cannot create spins at 100 % CPU).
  const root = join(work, 'no-cache-root');
  await mkdir(join(root, 'bin'), { recursive: true });
  await copyFile(VMSEED, join(root, 'bin/vmseed'));
  await symlink(join(ROOT, 'src'), join(root, 'src'));
  await writeFile(join(root, 'node_modules'), '');
  const env = { PATH: `${dirname(process.execPath)}:${process.env.PATH}` };
  const help = await vmseed(join(root, 'bin/vmseed'), ['--help'], env);
  assert.equal(help.code, 0, help.stderr);
  assert.match(help.stdout, /^usage: vmseed <command>/);
  const warm = await vmseed(join(root, 'bin/vmseed'), ['warm-cache'], env);
  assert.equal(warm.code, 1);
  assert.match(warm.stderr, /^vmseed warm-cache: Node's compile cache is off .*run it through bin\/vmseed\n$/);
});

test('NODE_DISABLE_COMPILE_CACHE=1 turns it off; warm-cache says so and takes no arguments', async () => {
  const off = await vmseed(VMSEED, ['warm-cache'], { NODE_COMPILE_CACHE: cache, NODE_DISABLE_COMPILE_CACHE: '1' });
  assert.equal(off.code, 1);
  assert.match(off.stderr, /compile cache is off/);
  const extra = await vmseed(VMSEED, ['warm-cache', 'now'], { NODE_COMPILE_CACHE: cache });
  assert.equal(extra.code, 2);
  assert.match(extra.stderr, /^vmseed warm-cache: takes no arguments\nusage: vmseed warm-cache/);
});
