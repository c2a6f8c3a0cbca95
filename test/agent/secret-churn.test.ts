// A Secret at the largest size the agent accepts, rewritten every 100 ms:
// each edit reaches the agent (a watch event of ~1.4 MiB), but what the
// agent keeps does not grow with the edits, re-renders are coalesced per
// VMI, and the last content is the one seeded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { DEFAULT_MAX_USER_DATA_BYTES } from '../../src/cloudinit/limits.ts';
import { CHANGE_MIN_INTERVAL_MS } from '../../src/agent/ref-dependencies.ts';
import { FakeKube } from '../support/fake-kube.ts';
import { imageOf, startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

// Live memory after a full collection: the V8 heap and the Buffers outside it.
function liveBytes(): number {
  gc();
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

// A shell script of exactly `size` bytes whose first line says which edit it is.
function userData(edit: number, size = DEFAULT_MAX_USER_DATA_BYTES): string {
  const head = `#!/bin/sh\n# edit ${String(edit).padStart(4, '0')}\n`;
  const line = `# ${'x'.repeat(61)}\n`;
  const body = line.repeat(Math.floor((size - head.length) / line.length));
  return head + body + '#'.repeat(size - head.length - body.length);
}

const MiB = 1024 * 1024;

test(
  'a Secret of the maximum size rewritten every 100 ms: memory bounded, renders coalesced, the last edit seeded',
  { timeout: 120_000 },
  async (t) => {
    // The fake keeps a short history, as the API server's watch cache does,
    // so that what grows is only what the agent keeps.
    const fake = await FakeKube.start({ historyLimit: 4 });
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    let renders = 0;
    const h = await startAgent(fake, {
      stateDir: dir.path,
      resyncPeriodMs: 3_600_000,
      render: (v, refs, o, c) => {
        if (v.metadata.name === 'churn') renders++;
        return renderSeed(v, refs, o, c);
      },
    });
    t.after(h.stop);
    const put = (edit: number) =>
      fake.setSecret({ metadata: { name: 'big', namespace: 'default' }, stringData: { userdata: userData(edit) } });
    put(0);
    fake.applyVmi(vmi('churn', { cloudInit: 'secretRef: {name: big}\n' }));
    await waitFor('seeded', () => h.agent.status.get('default/churn')?.state === 'ready', 60_000);
    await waitFor('watching', () => fake.objectWatchCount() === 1, 30_000);
    await h.agent.queue.idle();

    const baseline = liveBytes();
    const rendersBefore = renders;
    const edits = 30;
    const samples: number[] = [];
    const started = performance.now();
    for (let i = 1; i <= edits; i++) {
      put(i);
      await new Promise((r) => setTimeout(r, 100));
      // What the fake API server has not yet sent is its memory, not the
      // agent's: on a loaded machine the next edit waits for it.
      await waitFor('the edit sent', () => fake.watchBacklogBytes() === 0, 30_000);
      if (i % 5 === 0) samples.push(liveBytes() - baseline);
    }
    const last = `# edit ${String(edits).padStart(4, '0')}\n`;
    const image = await waitFor(
      'the last edit seeded',
      () => {
        const path = imageOf(h.store, fake.getVmi('default', 'churn')!);
        try {
          return readFileSync(path).includes(Buffer.from(last)) && path;
        } catch {
          return false; // replaced between listing and reading
        }
      },
      60_000,
    );
    await h.agent.queue.idle();
    const elapsed = performance.now() - started;
    samples.push(liveBytes() - baseline);
    const grew = Math.max(...samples);
    const rendered = renders - rendersBefore;
    t.diagnostic(
      `${edits} edits of ${DEFAULT_MAX_USER_DATA_BYTES} bytes in ${Math.round(elapsed)} ms: ${rendered} renders; ` +
        `live memory over the baseline: ${samples.map((b) => (b / MiB).toFixed(1)).join(', ')} MiB`,
    );

    // Kept per edit, 30 edits would hold ≥ 30 × 2.3 MiB (the event's
    // object, its decoded user-data); bounded, the agent holds one object
    // and one seed in flight whatever the number of edits.
    assert.ok(grew < 24 * MiB, `live memory grew by ${(grew / MiB).toFixed(1)} MiB over ${edits} edits`);
    // The coalescing's own bound: one re-render per interval per VMI.
    assert.ok(rendered >= 1, 'the edits were rendered');
    assert.ok(
      rendered <= Math.floor(elapsed / CHANGE_MIN_INTERVAL_MS) + 1,
      `${rendered} renders in ${Math.round(elapsed)} ms`,
    );
    assert.equal(h.agent.status.get('default/churn')?.state, 'ready');
    assert.equal(h.agent.status.get('default/churn')?.imagePath, image);
  },
);
