// The agent against the fake API server: add/update/delete, a VMI moved away,
// 410 → relist, API down at start-up, a stalled watch, restart with images
// on disk, a Secret created after its VMI, a bad VMI beside good ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, rmSync, statSync } from 'node:fs';
import { FakeKube } from '../support/fake-kube.ts';
import {
  imageOf,
  imagesOf,
  RecordingInjector,
  startAgent,
  tempDir,
  vmi,
  waitFor,
  NODE,
  type Harness,
} from '../support/agent-harness.ts';
import { fakeKubeAndDir } from '../support/agent-harness.ts';
import type { VmiObject } from '../../src/api/objects.ts';

function imagePath(h: Harness, v: VmiObject, ds: 'nocloud' | 'configdrive' = 'nocloud'): string {
  return imageOf(h.store, v, ds);
}

const setup = fakeKubeAndDir;

test(
  'add, update and delete: image appears, changes, goes; injector attaches, replaces nothing needlessly, detaches',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await setup(t);
    const injector = new RecordingInjector();
    const h = await startAgent(fake, { stateDir: dir.path, injector });
    t.after(h.stop);

    const a = fake.applyVmi(vmi('a'));
    await waitFor('image of a', () => existsSync(imagePath(h, a)));
    const path = imagePath(h, a);
    const first = readFileSync(path);
    assert.equal(injector.actions('inject', 'attached').length, 1);

    fake.applyVmi(vmi('a', { cloudInit: 'userData: |\n  #cloud-config\n  hostname: changed\n' }));
    // A changed seed is a new file (content-addressed): the domain's disk is
    // replaced with it, then the old one goes.
    await waitFor('re-inject', () => injector.actions('inject').length === 2);
    await h.agent.queue.idle();
    const changed = imagePath(h, a);
    assert.notEqual(changed, path);
    assert.ok(!readFileSync(changed).equals(first));
    assert.equal(injector.actions('inject', 'replaced').at(-1)?.path, changed);
    assert.deepEqual(imagesOf(h.store, a), [changed], 'the old image pruned after the replace');

    // An update that does not change the seed (status only) rewrites nothing.
    const before = statSync(changed);
    const v = structuredClone(fake.getVmi('default', 'a')!);
    v.status = { ...v.status, phase: 'Running' };
    fake.applyVmi(v);
    await new Promise((r) => setTimeout(r, 200));
    await h.agent.queue.idle();
    assert.equal(statSync(changed).ino, before.ino, 'image not rewritten');
    assert.equal(injector.actions('inject').length, 2, 'not injected again');

    // Level-based down to the file: an image deleted behind the agent's back
    // comes back on the next reconcile (here: the periodic resync).
    rmSync(changed);
    h.agent.resync();
    await waitFor('image of a rewritten', () => existsSync(changed));

    fake.deleteVmi('default', 'a');
    await waitFor('image of a removed', () => !existsSync(changed));
    // The file goes first, then its directory and the VMI's record: the
    // reconcile that removes them is over once the queue is idle.
    await h.agent.queue.idle();
    assert.equal(injector.actions('eject', 'detached').length, 1);
    assert.equal(h.agent.status.get('default/a'), undefined);

    const ready = fake.events().filter((e) => e.reason === 'SeedReady' && e.involvedObject.name === 'a');
    assert.ok(ready.length >= 1);
    assert.equal(ready[0].involvedObject.uid, a.metadata.uid);
    assert.equal(ready[0].type, 'Normal');
  },
);

test('a VMI moved to another node or finished loses its image', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const injector = new RecordingInjector();
  const h = await startAgent(fake, { stateDir: dir.path, injector });
  t.after(h.stop);
  const m = fake.applyVmi(vmi('mover'));
  const f = fake.applyVmi(vmi('finisher'));
  await waitFor('images', () => existsSync(imagePath(h, m)) && existsSync(imagePath(h, f)));

  // Relabelled to another node: the watch's selector no longer matches → DELETED.
  fake.applyVmi(vmi('mover', { node: 'node-b' }));
  fake.applyVmi(vmi('finisher', { phase: 'Succeeded' }));
  await waitFor('both removed', () => !existsSync(imagePath(h, m)) && !existsSync(imagePath(h, f)));
  assert.equal(injector.actions('eject', 'detached').length, 2);
});

for (const mode of ['event', 'status'] as const) {
  test(`410 Gone (${mode}) → relist → VMIs that vanished meanwhile are cleaned up`, { timeout: 60_000 }, async (t) => {
    const { fake, dir } = await setup(t);
    const h = await startAgent(fake, { stateDir: dir.path });
    t.after(h.stop);
    const keep = fake.applyVmi(vmi('keep'));
    const gone = fake.applyVmi(vmi('gone'));
    await waitFor('images', () => existsSync(imagePath(h, keep)) && existsSync(imagePath(h, gone)));
    const lists = () =>
      fake.requests.filter((r) => r.verb === 'list' && r.resource === 'virtualmachineinstances').length;
    const listsBefore = lists();

    fake.deleteVmiSilently('default', 'gone'); // the watch never hears of it
    fake.expire(mode);
    await waitFor('image of the vanished VMI removed', () => !existsSync(imagePath(h, gone)));
    assert.ok(existsSync(imagePath(h, keep)));
    assert.ok(lists() > listsBefore, 'relisted');
    if (mode === 'status') assert.ok(fake.requests.some((r) => r.verb === 'watch' && r.status === 410));
    const restarts = await h.metrics.registry.getSingleMetricAsString('vmseed_informer_restarts_total');
    assert.match(restarts, /reason="gone"\} [1-9]/);
  });
}

test('API server down at start-up, then back: not ready, then synced and seeding', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const a = fake.applyVmi(vmi('early'));
  await fake.refuse(true);
  const h = await startAgent(fake, { stateDir: dir.path, waitSynced: false, restartBaseMs: 50 });
  t.after(h.stop);
  // Waited for rather than slept for: the first list may be refused late on a loaded machine.
  await waitFor('the error is visible', () => h.agent.source.status().lastError);
  const r1 = await h.agent.status.readiness();
  assert.equal(r1.ready, false);
  assert.ok(r1.reasons.some((x) => /first list/.test(x)));
  assert.equal(h.agent.source.status().connected, false);

  await fake.refuse(false);
  await waitFor('image after the API came back', () => existsSync(imagePath(h, a)), 20_000);
  await waitFor('ready', async () => (await h.agent.status.readiness()).ready);
  assert.ok(h.agent.source.status().restarts >= 1);
  assert.match(await h.metrics.registry.getSingleMetricAsString('vmseed_informer_synced'), /vmseed_informer_synced 1/);

  // and down again while running: readiness drops, then recovers
  await fake.refuse(true);
  await waitFor('not ready while down', async () => !(await h.agent.status.readiness()).ready);
  await waitFor('synced metric drops to 0', async () =>
    /vmseed_informer_synced 0/.test(await h.metrics.registry.getSingleMetricAsString('vmseed_informer_synced')),
  );
  await fake.refuse(false);
  const b = fake.applyVmi(vmi('later'));
  await waitFor('seeding resumes', () => existsSync(imagePath(h, b)), 20_000);
});

test('a stalled watch is restarted by the watchdog and catches up', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const h = await startAgent(fake, { stateDir: dir.path, staleAfterMs: 400 });
  t.after(h.stop);
  fake.stallWatches();
  const v = fake.applyVmi(vmi('during-stall'));
  // The restart count is read in the same tick as the image is first seen
  // (it is counted before the restart's list): the image came after a
  // restart, not from the stalled watch, however late this test looks.
  const restartsAtImage = await waitFor(
    'watchdog restart delivers the VMI',
    () => existsSync(imagePath(h, v)) && { n: h.agent.source.status().restarts },
    20_000,
  );
  assert.ok(restartsAtImage.n >= 1, 'the stalled watch delivered nothing');
  assert.match(
    await h.metrics.registry.getSingleMetricAsString('vmseed_informer_restarts_total'),
    /reason="stale"\} [1-9]/,
  );
  assert.ok(h.lines.some((l) => l.includes('stale')));
});

test('bookmarks keep a quiet watch fresh (no watchdog restart)', { timeout: 60_000 }, async (t) => {
  const fake = await FakeKube.start({ bookmarkIntervalMs: 100 });
  const dir = await tempDir();
  t.after(async () => {
    await fake.close();
    await dir.remove();
  });
  // Bookmarks every 100 ms against a 2 s staleness bound, watched for
  // 5 s: fresh only thanks to them, and a starved test process (timers
  // late by a second) does not look stale.
  const h = await startAgent(fake, { stateDir: dir.path, staleAfterMs: 2000 });
  t.after(h.stop);
  await new Promise((r) => setTimeout(r, 5000));
  assert.equal(h.agent.source.status().restarts, 0);
  assert.ok(fake.requests.some((r) => r.verb === 'watch' && r.query.allowWatchBookmarks === 'true'));
});

test('dropped watch connections are re-established without losing events', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const h = await startAgent(fake, { stateDir: dir.path });
  t.after(h.stop);
  fake.dropWatches();
  const v = fake.applyVmi(vmi('after-drop'));
  await waitFor('image after reconnect', () => existsSync(imagePath(h, v)), 20_000);
});

test('restart with images on disk: no rewrite, no second attach; orphans collected', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const injector = new RecordingInjector();
  const v = fake.applyVmi(vmi('persistent'));
  const orphan = fake.applyVmi(vmi('orphan'));
  const h1 = await startAgent(fake, { stateDir: dir.path, injector });
  await waitFor('images', () => existsSync(imagePath(h1, v)) && existsSync(imagePath(h1, orphan)));
  await h1.agent.queue.idle();
  await h1.stop();
  const before = statSync(imagePath(h1, v));
  const attachesBefore = injector.actions('inject', 'attached').length;

  fake.deleteVmiSilently('default', 'orphan'); // deleted while the agent was down
  const h2 = await startAgent(fake, { stateDir: dir.path, injector });
  t.after(h2.stop);
  await waitFor('orphan collected', () => !existsSync(imagePath(h2, orphan)));
  await waitFor('persistent ready', () => h2.agent.status.get('default/persistent')?.state === 'ready');
  await h2.agent.queue.idle();
  const after = statSync(imagePath(h2, v));
  assert.equal(after.ino, before.ino, 'not rewritten');
  assert.equal(after.mtimeMs, before.mtimeMs, 'not rewritten');
  assert.equal(injector.actions('inject', 'attached').length, attachesBefore, 'no second attach');
  assert.equal(injector.actions('inject', 'replaced').length, 0);
  assert.equal(injector.attached.has(orphan.metadata.uid!), false, 'orphan detached');
  assert.match(
    h2.lines.find((l) => l.includes('garbage collection'))!,
    /"kept":1,"removed":1/,
  );
});

test('a Secret created after its VMI: seeded once it appears', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const h = await startAgent(fake, { stateDir: dir.path });
  t.after(h.stop);
  const v = fake.applyVmi(vmi('late-secret', { cloudInit: 'secretRef: {name: late}\n' }));
  await waitFor(
    'error SECRET_NOT_FOUND',
    () => h.agent.status.get('default/late-secret')?.lastError?.code === 'SECRET_NOT_FOUND',
  );
  assert.equal(existsSync(imagePath(h, v)), false);
  fake.setSecret({
    metadata: { name: 'late', namespace: 'default' },
    stringData: { userdata: '#cloud-config\nhostname: late\n' },
  });
  await waitFor('seeded within the backoff', () => existsSync(imagePath(h, v)), 20_000);
  // The file is written before the reconcile's last steps (prune, status).
  await waitFor('ready', () => h.agent.status.get('default/late-secret')?.state === 'ready', 20_000);
  assert.ok(fake.requests.some((r) => r.verb === 'get' && r.resource === 'secrets' && r.status === 404));
});

test(
  'a bad VMI next to good ones: good ones seeded, the bad one gets one SeedFailed Event with its code, counted',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await setup(t);
    const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 100 });
    t.after(h.stop);
    const good = [fake.applyVmi(vmi('good-1')), fake.applyVmi(vmi('good-2'))];
    const bad = fake.applyVmi(vmi('bad', { cloudInit: 'userDataBase64: "%%% not base64"\n' }));
    // a retryable failure repeats: its Event is counted, not duplicated
    fake.applyVmi(vmi('waiting', { cloudInit: 'secretRef: {name: nowhere}\n' }));
    await waitFor('good images', () => good.every((g) => existsSync(imagePath(h, g))));
    await waitFor('SeedFailed for bad', () =>
      fake.events().find((e) => e.reason === 'SeedFailed' && e.involvedObject.name === 'bad'),
    );
    await waitFor('counted repeats', () =>
      fake.events().find((e) => e.involvedObject.name === 'waiting' && e.count >= 3),
    );
    await new Promise((r) => setTimeout(r, 400)); // several resyncs
    await h.agent.events.flush();
    const badEvents = fake.events().filter((e) => e.involvedObject.name === 'bad');
    assert.equal(badEvents.length, 1);
    assert.equal(badEvents[0].type, 'Warning');
    assert.match(badEvents[0].message, /^USERDATA_BASE64_INVALID: /);
    assert.equal(badEvents[0].count, 1, 'terminal: not retried until the VMI changes');
    assert.equal(existsSync(imagePath(h, bad)), false);
    assert.equal(h.agent.status.get('default/bad')?.state, 'error');
    const waiting = fake.events().filter((e) => e.involvedObject.name === 'waiting');
    assert.equal(waiting.length, 1, 'one Event, counted');
    assert.ok(fake.requests.some((r) => r.verb === 'patch' && r.resource === 'events'));
    const errs = await h.metrics.registry.getSingleMetricAsString('vmseed_reconcile_errors_total');
    assert.match(errs, /code="USERDATA_BASE64_INVALID"\} 1/);

    // fixing the VMI (new resourceVersion) retries it
    fake.applyVmi(vmi('bad'));
    await waitFor('bad fixed', () => existsSync(imagePath(h, bad)));
  },
);

test('the agent makes exactly the API calls its ClusterRole grants', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await setup(t);
  const h = await startAgent(fake, { stateDir: dir.path });
  t.after(h.stop);
  fake.setSecret({ metadata: { name: 's', namespace: 'default' }, stringData: { userdata: '#cloud-config\n' } });
  const v = fake.applyVmi(vmi('rbac', { cloudInit: 'secretRef: {name: s}\n' }));
  fake.applyVmi(vmi('rbac-missing', { cloudInit: 'secretRef: {name: none}\n' }));
  await waitFor('image', () => existsSync(imagePath(h, v)));
  await waitFor('events patched', () => fake.requests.some((r) => r.verb === 'patch'));
  const used = new Set(fake.requests.map((r) => `${r.group}/${r.resource}:${r.verb}`));
  assert.deepEqual([...used].sort(), [
    '/events:create',
    '/events:patch',
    '/secrets:get',
    '/secrets:watch',
    'kubevirt.io/virtualmachineinstances:list',
    'kubevirt.io/virtualmachineinstances:watch',
  ]);
  // The node's VMIs and those migrating to it (KubeVirt's two labels).
  const selectors = new Set(
    fake.requests.filter((r) => r.resource === 'virtualmachineinstances').map((r) => r.query.labelSelector),
  );
  assert.deepEqual(selectors, new Set([`kubevirt.io/nodeName=${NODE}`, `kubevirt.io/migrationTargetNodeName=${NODE}`]));
});
