// Local mode: a manifest copied from a cluster keeps its kubevirt.io/nodeName
// label. Such a VMI is shown as skipped, with its node and the agent's, and
// logged once; a cluster agent (no reportOtherNodes) still forgets it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Reconciler } from '../../src/agent/reconciler.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { LogEventRecorder } from '../../src/agent/events.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { captureLogger } from '../support/capture-logger.ts';

function vmi(labels: Record<string, string>): VmiObject {
  return {
    metadata: {
      name: 'web',
      namespace: 'default',
      uid: 'u1',
      labels,
      annotations: { 'vmseed.io/cloud-init': 'userData: "#cloud-config\\n"' },
    },
    spec: {},
  };
}

function setup(reportOtherNodes: boolean, objects: Map<string, VmiObject>) {
  const { logger, lines } = captureLogger();
  const status = new StatusStore({
    version: 't',
    nodeName: 'laptop',
    stateDir: '/nonexistent',
    config: {},
    watch: () => ({ mode: 'local', synced: true }) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  const store = new Proxy(
    {},
    {
      get: () => () => {
        throw new Error('the store must not be used for a VMI on another node');
      },
    },
  );
  const r = new Reconciler({
    nodeName: 'laptop',
    cache: { get: (k) => objects.get(k) },
    refs: new MemoryResolver(),
    render: renderSeed,
    build: buildSeedImage,
    store: store as never,
    events: new LogEventRecorder(logger),
    status,
    records: status.records,
    logger,
    renderOptions: DEFAULT_RENDER_OPTIONS,
    ...(reportOtherNodes ? { reportOtherNodes: true } : {}),
  });
  return { r, status, lines };
}

test('local mode: a VMI labelled for another node is skipped with both node names, logged once', async () => {
  const objects = new Map([['default/web', vmi({ 'kubevirt.io/nodeName': 'node-7' })]]);
  const { r, status, lines } = setup(true, objects);
  assert.equal(await r.reconcile('default/web'), 'success');
  await r.reconcile('default/web');
  await r.reconcile('default/web');
  const rec = status.get('default/web');
  assert.equal(rec?.state, 'skipped');
  assert.equal(rec?.warnings[0]?.code, 'VMI_ON_OTHER_NODE');
  assert.match(rec.warnings[0].message, /"node-7".*--node-name "laptop"/);
  assert.equal(rec?.warnings[0]?.field, 'metadata.labels.kubevirt.io/nodeName');
  const logged = lines.filter((l) => l.includes('VMI names node'));
  assert.equal(logged.length, 1, 'logged once');
  // Another node name is news: logged again.
  objects.set('default/web', vmi({ 'kubevirt.io/nodeName': 'node-8' }));
  await r.reconcile('default/web');
  assert.equal(lines.filter((l) => l.includes('VMI names node')).length, 2);
  // Deleted: gone from the status page.
  objects.delete('default/web');
  await r.reconcile('default/web');
  assert.equal(status.get('default/web'), undefined);
});

test('cluster mode: a VMI of another node is not shown', async () => {
  const objects = new Map([['default/web', vmi({ 'kubevirt.io/nodeName': 'node-7' })]]);
  const { r, status, lines } = setup(false, objects);
  await r.reconcile('default/web');
  assert.equal(status.get('default/web'), undefined);
  assert.equal(lines.filter((l) => l.includes('VMI names node')).length, 0);
});
