// Local mode's source at start: a manifest renamed in while chokidar is
// still scanning is never lost (chokidar missed ~1 in 10 of those for good,
// and e2e/imds-guest failed on it). The rename may land before start()
// resolves (the listing after 'ready' applies it) or after (an event does).
import assert from 'node:assert/strict';
import { mkdtemp, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pino from 'pino';
import { LocalDirSource } from '../../src/agent/local/local-vmi-source.ts';

const vmi = (name: string) =>
  `apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: ${name}, namespace: default}\nspec: {domain: {}}\n`;
const quiet = pino({ level: 'silent' });

async function put(path: string, text: string): Promise<void> {
  await writeFile(`${path}.partial`, text);
  await rename(`${path}.partial`, path);
}

// A deadline in time, not in turns: a starved process takes long turns.
async function eventually(pred: () => boolean): Promise<boolean> {
  for (const end = Date.now() + 10_000; !pred() && Date.now() < end;) await new Promise((r) => setTimeout(r, 10));
  return pred();
}

test('a manifest renamed in while the watcher starts is applied (40 starts)', async () => {
  const missed: number[] = [];
  for (let i = 0; i < 40; i++) {
    const dir = await mkdtemp(join(tmpdir(), 'vmseed-local-start-'));
    try {
      await writeFile(join(dir, 'a.yaml'), vmi('a'));
      const keys: string[] = [];
      const src = new LocalDirSource({ dir, logger: quiet, onKey: (k) => keys.push(k) });
      const started = src.start();
      // 0-1 ms after the start: inside chokidar's initial scan.
      await new Promise((r) => setTimeout(r, i % 2));
      await put(join(dir, 'b.yaml'), vmi('b'));
      await started;
      if (!(await eventually(() => src.get('default/b') !== undefined))) missed.push(i);
      assert.ok(src.get('default/a'));
      assert.ok(keys.includes('default/a'));
      await src.stop();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  assert.deepEqual(missed, [], 'starts whose source lacked b.yaml');
});

// chokidar does report these; what this guards is the listing's own remove
// branch: it drops what is gone and never a file that is still there.
test('a manifest removed while the watcher starts is dropped', async () => {
  for (let i = 0; i < 20; i++) {
    const dir = await mkdtemp(join(tmpdir(), 'vmseed-local-start-'));
    try {
      await writeFile(join(dir, 'a.yaml'), vmi('a'));
      await writeFile(join(dir, 'b.yaml'), vmi('b'));
      const src = new LocalDirSource({ dir, logger: quiet, onKey: () => {} });
      const started = src.start();
      await new Promise((r) => setTimeout(r, i % 2));
      await unlink(join(dir, 'b.yaml'));
      await started;
      assert.ok(await eventually(() => src.get('default/b') === undefined), `start ${i}`);
      assert.ok(src.get('default/a'));
      await src.stop();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
});
