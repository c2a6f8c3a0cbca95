// The agent's periodic resync reads local manifests again: a change no
// file event reported (here: a watcher that reports nothing) reaches the
// source and the image, and a file removed unseen goes too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { FSWatcher } from 'chokidar';
import { waitFor } from '../support/agent-harness.ts';
import { startLocalAgent, vmiManifest } from '../support/local-agent.ts';

const vmi = (name: string, host: string) => vmiManifest(name, `hostname: ${host}`);

// Ready at once, then deaf.
function deafWatcher(): FSWatcher {
  const w = new EventEmitter();
  setImmediate(() => w.emit('ready'));
  return Object.assign(w, { close: () => Promise.resolve() }) as unknown as FSWatcher;
}

test(
  'resync reads every manifest again: changes and removals no event reported are applied',
  { timeout: 30_000 },
  async (t) => {
    const { agent, manifests } = await startLocalAgent(t, {
      settleMs: 20,
      watch: deafWatcher,
      files: { 'a.yaml': vmi('a', 'first'), 'b.yaml': vmi('b', 'bee') },
    });
    const annotation = () => agent.source.get('default/a')?.metadata.annotations?.['vmseed.io/cloud-init'] ?? '';
    const hashOf = (name: string) => agent.status.get(`default/${name}`)?.contentHash;
    await waitFor('both seeded', () => hashOf('a') !== undefined && hashOf('b') !== undefined);
    const before = hashOf('a');

    await writeFile(join(manifests, 'a.yaml'), vmi('a', 'second'));
    await unlink(join(manifests, 'b.yaml'));
    // Nothing reported it: nothing changes.
    await new Promise((r) => setTimeout(r, 200));
    assert.match(annotation(), /hostname: first/);
    assert.ok(agent.source.get('default/b'));

    agent.resync();
    await waitFor('the edit read', () => /hostname: second/.test(annotation()));
    await waitFor('a re-seeded', () => hashOf('a') !== undefined && hashOf('a') !== before);
    await waitFor('b gone', () => agent.source.get('default/b') === undefined);
  },
);
