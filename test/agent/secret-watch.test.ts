// Referenced Secrets and ConfigMaps are watched one by one (as kubelet
// watches the ones its pods mount): an edit reaches the seed without a
// resync, nothing is read again at rest, watches are shared and released,
// and a watch the server ends (timeout, 410) is renewed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import type { SecretObject } from '../../src/api/objects.ts';
import {
  imageOf,
  fakeKubeAndDir,
  RecordingInjector,
  startAgent,
  vmi,
  waitFor,
  type Harness,
} from '../support/agent-harness.ts';
import type { FakeKube, RequestRecord } from '../support/fake-kube.ts';

const secret = (name: string, hostname: string, extra: Partial<SecretObject> = {}): SecretObject => ({
  metadata: { name, namespace: 'default' },
  stringData: { userdata: `#cloud-config\nhostname: ${hostname}\n` },
  ...extra,
});

// All reconciles counted, whatever their result.
const reconcileCount = (exposition: string) =>
  exposition
    .split('\n')
    .filter((l) => l.startsWith('vmseed_reconcile_total{'))
    .reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);

const secretGets = (fake: FakeKube) => fake.requests.filter((r) => r.resource === 'secrets' && r.verb === 'get').length;

async function seeded(h: Harness, fake: FakeKube, name: string): Promise<string> {
  const v = fake.getVmi('default', name)!;
  await waitFor(`${name} ready`, () => h.agent.status.get(`default/${name}`)?.state === 'ready', 20_000);
  return imageOf(h.store, v);
}

async function reseeded(h: Harness, fake: FakeKube, name: string, before: string): Promise<string> {
  const v = fake.getVmi('default', name)!;
  return waitFor(
    `${name} reseeded`,
    () => {
      const now = imageOf(h.store, v);
      return now !== before && existsSync(now) && h.agent.status.get(`default/${name}`)?.imagePath === now && now;
    },
    20_000,
  );
}

test('a Secret edit reaches the seed without a resync; nothing is read again', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  // A resync an hour away: only the watch can bring the edit.
  const injector = new RecordingInjector();
  // The watches' clock: when the agent saw each change.
  let clock = Date.parse('2026-01-01T10:00:00Z');
  const h = await startAgent(fake, {
    stateDir: dir.path,
    resyncPeriodMs: 3_600_000,
    injector,
    nocloudHttp: {},
    watchRefs: { now: () => clock },
  });
  t.after(h.stop);
  fake.setSecret(secret('ud', 'one'));
  fake.applyVmi(vmi('edited', { cloudInit: 'secretRef: {name: ud}\n' }));
  const first = await seeded(h, fake, 'edited');
  assert.equal(secretGets(fake), 1, 'read once');
  const watch = await waitFor('a watch of that one Secret', () =>
    fake.requests.find((r) => r.resource === 'secrets' && r.verb === 'watch'),
  );
  assert.equal(watch.path, '/api/v1/namespaces/default/secrets');
  assert.equal(watch.query.fieldSelector, 'metadata.name=ud');
  await waitFor('watch open', () => fake.objectWatchCount() === 1);
  assert.equal(h.agent.dependencies?.dependencies('default/edited')[0]?.changedAt, '2026-01-01T10:00:00.000Z');

  clock = Date.parse('2026-01-01T11:30:00Z');
  fake.setSecret(secret('ud', 'two'));
  const second = await reseeded(h, fake, 'edited', first);
  assert.notEqual(second, first);
  assert.equal(secretGets(fake), 1, 'the edit came from the watch, not a read');
  // The domain's disk replaced, the HTTP datasource serving the new seed.
  await waitFor('disk replaced', () => injector.actions('inject', 'replaced').some((c) => c.path === second));
  const uid = fake.getVmi('default', 'edited')!.metadata.uid!;
  const served = Buffer.from(h.agent.seeds!.get(uid)!.seed.userData).toString();
  assert.match(served, /hostname: two/);
  assert.equal(h.agent.dependencies?.dependencies('default/edited')[0]?.state, 'exists');
  const gauge = await h.metrics.registry.getSingleMetricAsString('vmseed_object_watches');
  assert.match(gauge, /^vmseed_object_watches 1$/m);

  // The status page names what the seed depends on and when it last changed.
  const snapshot = h.agent.status.snapshot();
  const record = snapshot.vmis.find((r) => r.name === 'edited')!;
  assert.deepEqual(
    record.dependencies?.map((d) => [d.kind, d.namespace, d.name, d.state, d.immutable]),
    [['Secret', 'default', 'ud', 'exists', false]],
  );
  assert.equal(record.dependencies?.[0].changedAt, '2026-01-01T11:30:00.000Z', 'when the edit was seen');
  const { renderVmiPage, statusJson } = await import('../../src/http/status-page.ts');
  const html = renderVmiPage(snapshot, record, { now: new Date(clock + 120_000) });
  assert.match(html, /Depends on/);
  assert.match(html, /default\/ud/);
  assert.match(html, /changed 2026-01-01 11:30:00Z/);
  const json = JSON.stringify(statusJson(snapshot, undefined, new Date(clock)));
  assert.match(
    json,
    /"dependencies":\[\{"kind":"Secret","namespace":"default","name":"ud","state":"exists","immutable":false,"changedAt":"2026-01-01T11:30:00.000Z"\}\]/,
  );
  assert.doesNotMatch(html, /hostname: two/, 'names only, never content');
});

test('at rest, resyncs re-render from the cache: no reads', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 100 });
  t.after(h.stop);
  for (let i = 0; i < 5; i++) {
    fake.setSecret(secret(`s${i}`, `h${i}`));
    fake.applyVmi(vmi(`rest-${i}`, { cloudInit: `secretRef: {name: s${i}}\n` }));
  }
  for (let i = 0; i < 5; i++) await seeded(h, fake, `rest-${i}`);
  const reads = secretGets(fake);
  assert.equal(reads, 5);
  const reconciles = () => h.metrics.registry.getSingleMetricAsString('vmseed_reconcile_total');
  const before = await reconciles();
  // Polled rather than slept for: on a loaded machine the resync timer may
  // fire late, and the check below needs some resyncs to have run.
  const resyncs = reconcileCount(before);
  await waitFor('resyncs ran', async () => reconcileCount(await reconciles()) >= resyncs + 10, 20_000);
  assert.equal(secretGets(fake), reads, 'no Secret read at rest');
  assert.equal(fake.objectWatchCount(), 5, 'one watch per referenced object');
});

test('one watch per object, shared by its VMIs, stopped with the last one', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path });
  t.after(h.stop);
  fake.setSecret(secret('shared', 'x'));
  fake.applyVmi(vmi('a', { cloudInit: 'secretRef: {name: shared}\n' }));
  fake.applyVmi(vmi('b', { cloudInit: 'secretRef: {name: shared}\n' }));
  const [ia, ib] = [await seeded(h, fake, 'a'), await seeded(h, fake, 'b')];
  await waitFor('one watch', () => fake.objectWatchCount() === 1);
  assert.equal(h.watches?.openWatches, 1);
  fake.setSecret(secret('shared', 'y'));
  await reseeded(h, fake, 'a', ia);
  await reseeded(h, fake, 'b', ib);
  fake.deleteVmi('default', 'a');
  await waitFor('a gone', () => h.agent.status.get('default/a') === undefined);
  assert.equal(h.watches?.openWatches, 1, 'b still reads it');
  fake.deleteVmi('default', 'b');
  await waitFor('watch stopped', () => h.watches?.openWatches === 0 && fake.objectWatchCount() === 0);
  assert.equal(h.watches?.cachedObjects, 0, 'nothing cached for no one');
});

test('many VMIs on one Secret: one read, one watch, one edit reseeds them all', { timeout: 90_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  const n = 30;
  fake.setSecret(secret('common', 'before'));
  for (let i = 0; i < n; i++) fake.applyVmi(vmi(`crowd-${i}`, { cloudInit: 'secretRef: {name: common}\n' }));
  const images: string[] = [];
  for (let i = 0; i < n; i++) images.push(await seeded(h, fake, `crowd-${i}`));
  await waitFor('one watch', () => fake.objectWatchCount() === 1);
  assert.equal(h.watches?.openWatches, 1);
  assert.equal(h.watches?.cachedObjects, 1);
  assert.equal(secretGets(fake), 1, 'read once for all');
  fake.setSecret(secret('common', 'after'));
  for (let i = 0; i < n; i++) await reseeded(h, fake, `crowd-${i}`, images[i]);
  assert.equal(secretGets(fake), 1);
  assert.equal(fake.objectWatchCount(), 1);
});

test('a deleted Secret gives SECRET_NOT_FOUND; re-created, the VMI heals', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  fake.setSecret(secret('gone', 'one'));
  fake.applyVmi(vmi('orphan', { cloudInit: 'secretRef: {name: gone}\n' }));
  const first = await seeded(h, fake, 'orphan');
  await waitFor('watch open', () => fake.objectWatchCount() === 1);
  fake.deleteSecret('default', 'gone');
  await waitFor('SECRET_NOT_FOUND', () => h.agent.status.get('default/orphan')?.lastError?.code === 'SECRET_NOT_FOUND');
  assert.equal(h.agent.dependencies?.dependencies('default/orphan')[0]?.state, 'absent');
  fake.setSecret(secret('gone', 'two'));
  await reseeded(h, fake, 'orphan', first);
  assert.equal(secretGets(fake), 1, 'deletion and re-creation came from the watch');
});

test('a deleted ConfigMap gives CONFIGMAP_NOT_FOUND; re-created, the VMI heals', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  const cm = (hostname: string) => ({
    metadata: { name: 'cm-gone', namespace: 'default' },
    data: { userdata: `#cloud-config\nhostname: ${hostname}\n` },
  });
  fake.setConfigMap(cm('one'));
  fake.applyVmi(vmi('cm-orphan', { cloudInit: 'userDataFrom: {kind: configmap, name: cm-gone, key: userdata}\n' }));
  const first = await seeded(h, fake, 'cm-orphan');
  await waitFor('watch open', () => fake.objectWatchCount() === 1);
  fake.deleteConfigMap('default', 'cm-gone');
  const error = await waitFor('CONFIGMAP_NOT_FOUND', () => {
    const e = h.agent.status.get('default/cm-orphan')?.lastError;
    return e?.code === 'CONFIGMAP_NOT_FOUND' && e;
  });
  assert.match(error.message, /ConfigMap default\/cm-gone/);
  assert.equal(existsSync(first), true, 'the seed in place stays');
  fake.setConfigMap(cm('two'));
  await reseeded(h, fake, 'cm-orphan', first);
  assert.equal(h.agent.status.get('default/cm-orphan')?.lastError, undefined);
  const cmGets = fake.requests.filter((r) => r.resource === 'configmaps' && r.verb === 'get').length;
  assert.equal(cmGets, 1, 'deletion and re-creation came from the watch');
});

test(
  'a VMI that stops referencing an object stops its watch; the new one is watched',
  { timeout: 30_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
    t.after(h.stop);
    fake.setSecret(secret('old-ref', 'one'));
    fake.setSecret(secret('new-ref', 'two'));
    const v = fake.applyVmi(vmi('mover', { cloudInit: 'secretRef: {name: old-ref}\n' }));
    const first = await seeded(h, fake, 'mover');
    await waitFor('watching old-ref', () => fake.objectWatchCount() === 1);
    const moved = structuredClone(v);
    moved.metadata.annotations!['vmseed.io/cloud-init'] = 'secretRef: {name: new-ref}\n';
    fake.applyVmi(moved);
    await reseeded(h, fake, 'mover', first);
    await waitFor(
      'only new-ref depended on',
      () =>
        h.agent.dependencies
          ?.dependencies('default/mover')
          .map((d) => d.name)
          .join() === 'new-ref',
    );
    await waitFor('one watch', () => fake.objectWatchCount() === 1 && h.watches?.openWatches === 1);
    assert.equal(h.watches?.cachedObjects, 1, 'old-ref is no longer held');
  },
);

test('a bad ConfigMap parks its VMI until the ConfigMap is fixed', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  fake.setConfigMap({ metadata: { name: 'cm', namespace: 'default' }, binaryData: { userdata: '%%%' } });
  fake.applyVmi(vmi('parked', { cloudInit: 'userDataFrom: {kind: configmap, name: cm, key: userdata}\n' }));
  await waitFor('terminal error', () => h.agent.status.get('default/parked')?.state === 'error', 20_000);
  fake.setConfigMap({
    metadata: { name: 'cm', namespace: 'default' },
    data: { userdata: '#cloud-config\nhostname: fixed\n' },
  });
  await seeded(h, fake, 'parked');
});

test('watches renewed at their timeout and after 410 Gone keep the seed current', { timeout: 40_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, {
    stateDir: dir.path,
    resyncPeriodMs: 3_600_000,
    watchRefs: { minWatchTimeoutMs: 1000 },
  });
  t.after(h.stop);
  fake.setSecret(secret('renewed', 'one'));
  fake.applyVmi(vmi('renewing', { cloudInit: 'secretRef: {name: renewed}\n' }));
  const first = await seeded(h, fake, 'renewing');
  const watches = () => fake.requests.filter((r) => r.resource === 'secrets' && r.verb === 'watch');
  await waitFor('renewed twice', () => watches().length >= 3, 20_000);
  assert.equal(secretGets(fake), 1, 'a renewal resumes from the resourceVersion, no read');
  assert.ok(
    watches()
      .slice(1)
      .every((w) => Number(w.query.resourceVersion) > 0),
  );
  fake.setSecret(secret('renewed', 'two'));
  const second = await reseeded(h, fake, 'renewing', first);

  // What the watch missed before its history expired comes with the fresh read.
  fake.setSecretSilently(secret('renewed', 'three'));
  fake.expire('status');
  const third = await reseeded(h, fake, 'renewing', second);
  // The read follows the fresh watch, whose first event may come before it.
  await waitFor('410: one fresh read', () => secretGets(fake) === 2);
  await waitFor('watching again', () => fake.objectWatchCount() === 1);
  fake.setSecret(secret('renewed', 'four'));
  await reseeded(h, fake, 'renewing', third);
});

test(
  'a dropped watch connection is renewed after a backoff, from its resourceVersion',
  { timeout: 30_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
    t.after(h.stop);
    fake.setSecret(secret('dropped', 'one'));
    fake.applyVmi(vmi('cut', { cloudInit: 'secretRef: {name: dropped}\n' }));
    const first = await seeded(h, fake, 'cut');
    await waitFor('watching', () => fake.objectWatchCount() === 1);
    fake.dropWatches();
    // Changed while no watch is open: the renewed watch replays it.
    fake.setSecret(secret('dropped', 'two'));
    await reseeded(h, fake, 'cut', first);
    assert.equal(secretGets(fake), 1, 'resumed, not read again');
  },
);

test('an immutable Secret is read once and not watched', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 100 });
  t.after(h.stop);
  fake.setSecret(secret('frozen', 'ice', { immutable: true } as Partial<SecretObject>));
  fake.applyVmi(vmi('cold', { cloudInit: 'secretRef: {name: frozen}\n' }));
  await seeded(h, fake, 'cold');
  await new Promise((r) => setTimeout(r, 500)); // resyncs
  assert.equal(fake.requests.filter((r) => r.resource === 'secrets' && r.verb === 'watch').length, 0);
  assert.equal(secretGets(fake), 1);
  assert.equal(h.watches?.openWatches, 0);
  assert.equal(h.agent.dependencies?.dependencies('default/cold')[0]?.immutable, true);
});

test('a Secret rewritten every 20 ms: re-renders coalesced, the last content wins', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  let renders = 0;
  // Held while the edits go on: a render slower than the edits, whatever the
  // machine's load, so that coalescing (not timing) decides the count.
  let hold: Promise<void> | undefined;
  const { renderSeed } = await import('../../src/cloudinit/render.ts');
  const h = await startAgent(fake, {
    stateDir: dir.path,
    resyncPeriodMs: 3_600_000,
    render: async (v, refs, o, c) => {
      if (v.metadata.name === 'busy') {
        renders++;
        await hold;
      }
      return renderSeed(v, refs, o, c);
    },
  });
  t.after(h.stop);
  fake.setSecret(secret('hot', 'h0'));
  fake.applyVmi(vmi('busy', { cloudInit: 'secretRef: {name: hot}\n' }));
  await seeded(h, fake, 'busy');
  await waitFor('watch open', () => fake.objectWatchCount() === 1);
  const before = renders;
  const edits = 50;
  let release!: () => void;
  hold = new Promise((r) => (release = r));
  for (let i = 1; i <= edits; i++) {
    fake.setSecret(secret('hot', `h${i}`));
    await new Promise((r) => setTimeout(r, 20));
  }
  release();
  // The image is read when present: the agent prunes the one it replaces.
  const { readFileSync } = await import('node:fs');
  const holdsLast = () => {
    try {
      return readFileSync(imageOf(h.store, fake.getVmi('default', 'busy')!)).includes(`hostname: h${edits}\n`);
    } catch {
      return false;
    }
  };
  await waitFor('the image holds the last edit', holdsLast, 20_000);
  await h.agent.queue.idle();
  assert.ok(renders - before < edits / 2, `${renders - before} renders for ${edits} edits`);
});

test('a Secret unchanged for longer than the server keeps history is still watched', { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  fake.setSecret(secret('old', 'one'));
  fake.expire('event'); // its resourceVersion is no longer served
  fake.applyVmi(vmi('ancient', { cloudInit: 'secretRef: {name: old}\n' }));
  const first = await seeded(h, fake, 'ancient');
  await waitFor('watching', () => fake.objectWatchCount() === 1);
  fake.setSecret(secret('old', 'two'));
  await reseeded(h, fake, 'ancient', first);
});

test('a VMI reading more objects than its budget fails with REFERENCES_TOO_MANY', async () => {
  const { ObjectWatches } = await import('../../src/kube/object-watches.ts');
  const { pino } = await import('pino');
  let gets = 0;
  const w = new ObjectWatches({
    api: {
      request: async () => {
        gets++;
        return { status: 404, body: undefined };
      },
    },
    watcher: { watch: async () => ({ abort: () => {} }) },
    logger: pino({ level: 'silent' }),
    maxPerVmi: 2,
  });
  const r = w.reader('ns/vm');
  assert.equal(await r.getSecret('ns', 'a'), undefined);
  assert.equal(await r.getConfigMap('ns', 'b'), undefined);
  assert.equal(await r.getSecret('ns', 'a'), undefined, 'a second read of the same object is free');
  await assert.rejects(r.getSecret('ns', 'c'), (e: Error & { code?: string }) => e.code === 'REFERENCES_TOO_MANY');
  assert.equal(gets, 2, 'refused before any call');
  w.use('ns/vm', r.read());
  r.done();
  assert.equal(w.openWatches, 2);
  w.release('ns/vm');
  assert.equal(w.openWatches, 0);
  assert.equal(w.cachedObjects, 0);
  await w.stop();
});

test(
  'a VMI over its budget of objects fails with REFERENCES_TOO_MANY; watches stay bounded, other VMIs unaffected',
  { timeout: 60_000 },
  async (t) => {
    const { MAX_OBJECTS_PER_VMI } = await import('../../src/kube/object-watches.ts');
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
    t.after(h.stop);
    // As many files as the annotation allows, each from a Secret of its own,
    // and the user-data from one more.
    const files: string[] = [];
    for (let i = 0; i < MAX_OBJECTS_PER_VMI; i++) {
      fake.setSecret({ metadata: { name: `f${i}`, namespace: 'default' }, stringData: { k: `${i}` } });
      files.push(`{from: {kind: secret, name: f${i}, key: k}, path: /etc/f${i}}`);
    }
    fake.setSecret(secret('ud', 'greedy'));
    fake.applyVmi(vmi('greedy', { cloudInit: `secretRef: {name: ud}\nfiles: [${files.join(', ')}]\n` }));
    fake.setSecret(secret('own', 'modest'));
    fake.applyVmi(vmi('modest', { cloudInit: 'secretRef: {name: own}\n' }));
    await seeded(h, fake, 'modest');
    const error = await waitFor(
      'REFERENCES_TOO_MANY',
      () => {
        const e = h.agent.status.get('default/greedy')?.lastError;
        return e?.code === 'REFERENCES_TOO_MANY' && e;
      },
      30_000,
    );
    assert.match(error.message, new RegExp(`more than ${MAX_OBJECTS_PER_VMI} Secrets and ConfigMaps`));
    assert.match(error.message, /merge them into fewer objects/);
    assert.equal(h.agent.status.get('default/greedy')?.state, 'error');
    await h.agent.queue.idle();
    assert.ok(
      (h.watches?.openWatches ?? 0) <= MAX_OBJECTS_PER_VMI + 1,
      `${h.watches?.openWatches} watches: the budget and modest's one`,
    );
    assert.ok(secretGets(fake) <= MAX_OBJECTS_PER_VMI + 1, `${secretGets(fake)} reads`);
  },
);

test('the documented budgets are the code’s', async () => {
  const { readFileSync } = await import('node:fs');
  const { MAX_OBJECTS_PER_VMI, DEFAULT_WATCH_BACKOFF, GONE_READ_SPREAD_MS } =
    await import('../../src/kube/object-watches.ts');
  const { CHANGE_MIN_INTERVAL_MS } = await import('../../src/agent/ref-dependencies.ts');
  const { CHANGE_POLICY_ANNOTATION } = await import('../../src/cloudinit/change-policy.ts');
  const guide = readFileSync(new URL('../../docs/vm-owners-guide.md', import.meta.url), 'utf8');
  const kubevirt = readFileSync(new URL('../../docs/kubevirt.md', import.meta.url), 'utf8');
  const ops = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
  assert.ok(guide.includes(`| ${MAX_OBJECTS_PER_VMI} | \`REFERENCES_TOO_MANY\` |`));
  assert.ok(kubevirt.includes(`at most one re-render per ${CHANGE_MIN_INTERVAL_MS} ms`));
  assert.ok(kubevirt.includes(`\`${CHANGE_POLICY_ANNOTATION}\``));
  assert.ok(ops.includes(`random moment of up to ${GONE_READ_SPREAD_MS / 1000} s`));
  assert.ok(
    ops.includes(`backoff from ${DEFAULT_WATCH_BACKOFF.baseMs / 1000} s to ${DEFAULT_WATCH_BACKOFF.maxMs / 1000} s`),
  );
});

// After 410 Gone the agent needs a fresh read and a fresh watch; the Secret
// may be deleted (and perhaps re-created) right after either is answered,
// before the other: the agent must end where the API server is.
for (const [moment, answered] of [
  ['its fresh read', (r: RequestRecord) => r.verb === 'get' && r.status === 200],
  ['its fresh watch', (r: RequestRecord) => r.verb === 'watch' && r.status === 200 && !r.query.resourceVersion],
] as const) {
  for (const recreated of [false, true]) {
    test(
      `after 410, a Secret deleted${recreated ? ' and re-created' : ''} right after ${moment} is seen so`,
      { timeout: 40_000 },
      async (t) => {
        const { fake, dir } = await fakeKubeAndDir(t);
        const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
        t.after(h.stop);
        fake.setSecret(secret('flux', 'one'));
        fake.applyVmi(vmi('flux-vm', { cloudInit: 'secretRef: {name: flux}\n' }));
        const first = await seeded(h, fake, 'flux-vm');
        await waitFor('watching', () => fake.objectWatchCount() === 1);
        let struck = false;
        fake.afterAnswer((r) => {
          if (struck || r.resource !== 'secrets' || !answered(r)) return;
          struck = true;
          fake.deleteSecret('default', 'flux');
          if (recreated) fake.setSecret(secret('flux', 'reborn'));
        });
        const before = secretGets(fake);
        fake.expire('status');
        await waitFor('the change made in the window', () => struck, 10_000);
        if (recreated) {
          const now = await reseeded(h, fake, 'flux-vm', first);
          const { readFileSync } = await import('node:fs');
          assert.ok(readFileSync(now).includes(Buffer.from('hostname: reborn\n')), 'the re-created content');
        } else {
          const error = await waitFor(
            'SECRET_NOT_FOUND',
            () => {
              const e = h.agent.status.get('default/flux-vm')?.lastError;
              return e?.code === 'SECRET_NOT_FOUND' && e;
            },
            10_000,
          );
          assert.match(error.message, /Secret default\/flux /);
          assert.equal(h.agent.dependencies?.dependencies('default/flux-vm')[0]?.state, 'absent');
        }
        await waitFor('one fresh read for the 410', () => secretGets(fake) - before === 1);
        await waitFor('watching again', () => fake.objectWatchCount() === 1);
        assert.equal(
          h.agent.status.get('default/flux-vm')?.lastError?.code,
          recreated ? undefined : 'SECRET_NOT_FOUND',
        );
        assert.equal(secretGets(fake) - before, 1, 'one fresh read for the 410');
      },
    );
  }
}
