// `vmseed agent --local DIR` as `npm start` runs it, edited by `sed -i`
// (write a temporary file, rename it over the manifest: an atomic replace,
// as a ConfigMap volume's update is) many times in a row. The last content
// on disk is the image's, and the VMI never counts as deleted on the way.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { isoFilesUnder, tempDir, waitFor } from '../support/agent-harness.ts';
import { vmiManifest } from '../support/local-agent.ts';

const run = promisify(execFile);
const ROOT = new URL('../../', import.meta.url).pathname;

const manifest = (queue: string) =>
  vmiManifest('worker', `write_files:\n  - path: /etc/worker.conf\n    content: queue=${queue}`);

function images(root: string): string[] {
  return isoFilesUnder(root).map((p) => join(root, p));
}

// An image replaced while it is read (the old one is pruned) reads as none.
async function userData(image: string): Promise<string> {
  return (
    await run('isoinfo', ['-i', image, '-R', '-x', '/user-data'], { encoding: 'utf8' }).catch(() => ({ stdout: '' }))
  ).stdout;
}

test(
  'sed -i in a loop: the image follows the last edit, and the VMI is never removed',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-local-edits-');
    const manifests = join(dir.path, 'manifests');
    const state = join(dir.path, 'seeds');
    await mkdir(manifests);
    const file = join(manifests, 'worker.yaml');
    await writeFile(file, manifest('q0'));
    const child = spawn(
      process.execPath,
      [join(ROOT, 'src/main.ts'), 'agent', '--local', manifests, '--state-dir', state, '--listen', '127.0.0.1:0'],
      { cwd: dir.path, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    t.after(async () => {
      if (child.exitCode === null) child.kill('SIGKILL');
      await exited;
      await dir.remove();
    });
    await waitFor('first image', () => images(state).length === 1, 60_000);

    // Rounds of back-to-back edits, each round's last value checked.
    let n = 0;
    for (let round = 0; round < 5; round++) {
      const edits = 10 + round * 5;
      for (let i = 0; i < edits; i++) {
        await run('sed', ['-i', `s/queue=q${n}$/queue=q${n + 1}/`, file]);
        n++;
      }
      const want = `queue=q${n}`;
      const held = async () => {
        const all = images(state);
        return all.length === 1 ? /queue=\S+/.exec(await userData(all[0]))?.[0] : `${all.length} images`;
      };
      await waitFor(`the image to hold ${want}`, async () => (await held()) === want, 60_000).catch(
        async (e: Error) => {
          throw new Error(
            `${e.message}; it holds ${await held()}; file: ${/queue=\S+/.exec(readFileSync(file, 'utf8'))?.[0]}`,
          );
        },
      );
    }
    assert.doesNotMatch(log, /seed image removed/);
    child.kill('SIGTERM');
    assert.equal(await exited, 0);
  },
);
