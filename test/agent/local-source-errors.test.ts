// A manifest that does not parse stays reported until that file parses or
// goes: another file parsing (the initial scan reads them concurrently, and
// any later edit) must not clear it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pino } from 'pino';
import { LocalDirSource } from '../../src/agent/local/local-vmi-source.ts';
import { tempDir, waitFor } from '../support/agent-harness.ts';

const vmi = (name: string) =>
  `apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: ${name}, namespace: default, uid: u-${name}}\nspec: {}\n`;

test(
  'a broken manifest stays reported while other files parse; cleared when it is removed',
  { timeout: 30_000 },
  async (t) => {
    const dir = await tempDir();
    await writeFile(join(dir.path, 'a-good.yaml'), vmi('a'));
    await writeFile(join(dir.path, 'zz-broken.yaml'), 'metadata: {name: half\n');
    const source = new LocalDirSource({ dir: dir.path, logger: pino({ level: 'silent' }), onKey: () => {} });
    // The watcher stops before its directory goes (hooks run in order).
    t.after(async () => {
      await source.stop();
      await dir.remove();
    });
    await source.start();
    await source.synced();
    await waitFor('the broken file reported', () =>
      /^MANIFEST_INVALID: .*zz-broken\.yaml/.test(source.status().lastError ?? ''),
    );

    // Another file parses: the broken one is still broken.
    await writeFile(join(dir.path, 'b-good.yaml'), vmi('b'));
    await waitFor('b seen', () => source.keys().includes('default/b'));
    await writeFile(join(dir.path, 'a-good.yaml'), vmi('a2'));
    await waitFor('a edited', () => source.keys().includes('default/a2'));
    assert.match(source.status().lastError ?? '', /^MANIFEST_INVALID: .*zz-broken\.yaml/);

    // Removed: cleared.
    await rm(join(dir.path, 'zz-broken.yaml'));
    await waitFor('removed file clears the error', () => source.status().lastError === undefined);
  },
);
