// The agent's periodic resync reads local manifests again: a change no
// file event reported (here: a watcher that reports nothing) reaches the
// source and the image, and a file removed unseen goes too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { mkdir, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { FSWatcher } from 'chokidar';
import { Agent } from '../../src/agent/agent.ts';
import { LogEventRecorder } from '../../src/agent/events.ts';
import { LocalDirSource } from '../../src/agent/local/source.ts';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { tempDir, waitFor } from '../support/agent-harness.ts';

const vmi = (name: string, host: string) => `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ${name}
  namespace: default
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
        hostname: ${host}
spec: {domain: {}}
`;

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
    const dir = await tempDir('vmseed-local-resync-');
    const manifests = join(dir.path, 'manifests');
    const state = join(dir.path, 'seeds');
    await mkdir(manifests);
    await writeFile(join(manifests, 'a.yaml'), vmi('a', 'first'));
    await writeFile(join(manifests, 'b.yaml'), vmi('b', 'bee'));
    const { logger } = captureLogger('info');
    const agent = new Agent({
      version: 'test',
      nodeName: 'node-a',
      stateDir: state,
      config: {},
      makeSource: (onKey) => new LocalDirSource({ dir: manifests, logger, onKey, settleMs: 20, watch: deafWatcher }),
      refs: (source) => source as LocalDirSource,
      render: renderSeed,
      build: buildSeedImage,
      store: new ImageStore({ root: state }),
      events: new LogEventRecorder(logger),
      logger,
      concurrency: 2,
      renderOptions: { kubevirtVolumes: 'own', maxUserDataBytes: 1 << 20, maxNetworkDataBytes: 1 << 16 },
      resyncPeriodMs: 600_000,
      fsync: false,
    });
    t.after(async () => {
      await agent.stop(2000);
      await dir.remove();
    });
    await agent.start();
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
