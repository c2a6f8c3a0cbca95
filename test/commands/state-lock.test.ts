// Two real agent processes on one state directory: the second exits with a
// message naming the first, the first keeps working; once the first dies
// (SIGKILL: no clean-up of its own) the lock is gone with it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFile, mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../support/agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

interface Run {
  pid: number;
  log: () => string;
  exited: Promise<number | null>;
  kill(sig: NodeJS.Signals): void;
}

function agent(dir: string, manifests: string, state: string): Run {
  const child = spawn(
    process.execPath,
    [join(ROOT, 'src/main.ts'), 'agent', '--local', manifests, '--state-dir', state, '--listen', '127.0.0.1:0'],
    {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  return {
    pid: child.pid!,
    log: () => out,
    exited: new Promise((r) => child.on('exit', (c) => r(c))),
    kill: (sig) => void (child.exitCode === null && child.signalCode === null && child.kill(sig)),
  };
}

const urlOf = (run: Run) =>
  waitFor('listen url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(run.log())?.[1], 60_000);

test(
  'a second agent on the same state directory exits with a clear message; the lock dies with its holder',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-lock-');
    const runs: Run[] = [];
    t.after(async () => {
      for (const r of runs) r.kill('SIGKILL');
      await dir.remove();
    });
    const manifests = join(dir.path, 'manifests');
    const state = join(dir.path, 'seeds');
    await mkdir(manifests);
    await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));

    const first = agent(dir.path, manifests, state);
    runs.push(first);
    const url = await urlOf(first);
    await waitFor('first agent ready', async () => (await fetch(`${url}/readyz`)).status === 200, 60_000);
    assert.match(await readFile(join(state, '.vmseed.lock'), 'utf8'), new RegExp(`^pid ${first.pid} on `));

    const second = agent(dir.path, manifests, state);
    runs.push(second);
    assert.equal(await second.exited, 1, second.log());
    assert.match(
      second.log(),
      new RegExp(
        `^vmseed agent: another vmseed agent is using ${state} \\(pid ${first.pid} on [^ ]+ since [^)]+\\): run one agent per state directory`,
      ),
    );
    assert.equal(second.log().trim().split('\n').length, 1, 'one line, before any listener or GC');
    // The first one did not notice.
    assert.equal((await fetch(`${url}/readyz`)).status, 200);
    assert.equal(first.log().includes('"level":50'), false, first.log());

    // SIGKILL: the holder cannot release anything; the kernel does.
    first.kill('SIGKILL');
    await first.exited;
    const third = agent(dir.path, manifests, state);
    runs.push(third);
    const url3 = await urlOf(third);
    await waitFor('third agent ready', async () => (await fetch(`${url3}/readyz`)).status === 200, 60_000);
    assert.match(await readFile(join(state, '.vmseed.lock'), 'utf8'), new RegExp(`^pid ${third.pid} on `));
    third.kill('SIGTERM');
    assert.equal(await third.exited, 0, third.log().slice(-2000));
  },
);

test('a lock file that is a symlink is refused and its target left alone', { timeout: 180_000 }, async (t) => {
  const dir = await tempDir('vmseed-lock-link-');
  t.after(() => dir.remove());
  const manifests = join(dir.path, 'manifests');
  const state = join(dir.path, 'seeds');
  await mkdir(manifests);
  await mkdir(state);
  const victim = join(dir.path, 'precious.conf');
  await writeFile(victim, 'keep me\n');
  await symlink(victim, join(state, '.vmseed.lock'));
  const run = agent(dir.path, manifests, state);
  assert.equal(await run.exited, 1, run.log());
  assert.match(run.log(), /\.vmseed\.lock is a symlink; vmseed will not lock through it/);
  assert.equal(await readFile(victim, 'utf8'), 'keep me\n');
});
