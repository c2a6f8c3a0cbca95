// The VMI informer's watches against the fake API server over TLS: bounded
// like client-go's reflector (timeoutSeconds in [min, 2*min]), renewed from
// their resourceVersion when the server ends them and when they run past
// their timeout; lists that meet 429/5xx back off; namespaced mode.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeKube, type FakeKubeOptions, type RequestRecord } from '../support/fake-kube.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { vmi, waitFor, NODE } from '../support/agent-harness.ts';
import { namespacedRbac } from '../support/kube-authz.ts';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { KubeConnectionApi } from '../../src/agent/kube-api.ts';
import { KubeConnection } from '../../src/agent/kube-connection.ts';
import { tempDir } from '../support/agent-harness.ts';
import { KubeVmiSource, type KubeSourceOptions } from '../../src/agent/kube-source.ts';

async function start(
  t: { after(fn: () => Promise<void>): void },
  fakeOptions: FakeKubeOptions,
  options: Partial<KubeSourceOptions> = {},
  { waitSynced = true, before, connect }: { waitSynced?: boolean; before?: (fake: FakeKube) => void; connect?: (fake: FakeKube) => KubeConnection } = {},
) {
  const fake = await FakeKube.start(fakeOptions);
  before?.(fake);
  const connection = connect ? connect(fake) : fake.connection();
  const { logger, lines } = captureLogger('debug');
  const keys: string[] = [];
  const source = new KubeVmiSource({
    connection,
    api: new KubeConnectionApi(connection, { timeoutMs: 5000, retry: { retries: 0 } }),
    nodeName: NODE,
    logger,
    onKey: (k) => keys.push(k),
    restartBackoff: { baseMs: 50, maxMs: 400 },
    staleAfterMs: 60_000,
    ...options,
  });
  t.after(async () => {
    await source.stop();
    await connection.close();
    await fake.close();
  });
  await source.start();
  if (waitSynced) await source.synced();
  return { fake, source, keys, lines };
}

const vmiCalls = (fake: FakeKube, verb: 'list' | 'watch'): RequestRecord[] => fake.requests.filter((r) => r.resource === 'virtualmachineinstances' && r.verb === verb);

test('watches ask for timeoutSeconds in [min, 2*min]; the server ends them; each renewal resumes from its resourceVersion: no relist, no event lost', { timeout: 30_000 }, async (t) => {
  const { fake, source, keys } = await start(t, {}, { minWatchTimeoutMs: 1000 });
  const names: string[] = [];
  // A change in every gap between a watch's end and the next one.
  let gap = 0;
  fake.afterWatchTimeout(() => {
    names.push(`gap-${gap}`);
    fake.applyVmi(vmi(`gap-${gap++}`));
  });
  for (let i = 0; vmiCalls(fake, 'watch').length < 4; i++) {
    names.push(`v${i}`);
    fake.applyVmi(vmi(`v${i}`));
    fake.applyVmi(vmi(`elsewhere-${i}`, { node: 'node-b' }));
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(i < 60, 'the server-side timeout renews the watch');
  }
  assert.ok(gap >= 3, 'changes were made while no watch was open');
  await waitFor('every VMI seen', () => names.every((n) => source.get(`default/${n}`)), 5000);
  assert.deepEqual([...new Set(keys)].sort(), names.map((n) => `default/${n}`).sort(), 'every VMI enqueued, none of the other node');
  const watches = vmiCalls(fake, 'watch');
  assert.equal(vmiCalls(fake, 'list').length, 1, 'renewals never relist');
  for (const w of watches) {
    assert.ok(['1', '2'].includes(w.query.timeoutSeconds!), `timeoutSeconds ${w.query.timeoutSeconds}`);
    assert.equal(w.query.allowWatchBookmarks, 'true');
    assert.equal(w.query.labelSelector, `kubevirt.io/nodeName=${NODE}`);
    assert.match(w.query.resourceVersion ?? '', /^[1-9]\d*$/, 'from a resourceVersion, never from "now" or 0');
  }
  const rvs = watches.map((w) => Number(w.query.resourceVersion));
  assert.deepEqual(rvs, [...rvs].sort((a, b) => a - b), 'resourceVersions only move forward');
  assert.equal(source.status().restarts, 0);
  assert.equal(source.status().connected, true);
});

test('a watch the server never ends is cut past timeoutSeconds + grace and renewed from its resourceVersion', { timeout: 30_000 }, async (t) => {
  const { fake, source, lines } = await start(t, {}, { minWatchTimeoutMs: 1000, watchGraceMs: 300 });
  fake.honourWatchTimeouts(false);
  fake.applyVmi(vmi('before'));
  // The first watch was opened before honourWatchTimeouts(false); wait for one that the server will not end.
  const firstIgnored = await waitFor('a watch the server ignores the timeout of', () => vmiCalls(fake, 'watch').length >= 2 && vmiCalls(fake, 'watch').length, 10_000);
  await waitFor('renewed by the client', () => vmiCalls(fake, 'watch').length > firstIgnored, 10_000);
  assert.ok(lines.some((l) => l.includes('ran past its timeout')), 'the cut is logged');
  await waitFor('the cut watch closed on the server side too', () => fake.watchCount() === 1, 5000);
  fake.applyVmi(vmi('after'));
  await waitFor('an event on the renewed watch', () => source.get('default/after'), 5000);
  assert.equal(vmiCalls(fake, 'list').length, 1, 'no relist');
  assert.equal(source.status().restarts, 0);
});

test('a list answered 429 waits the Retry-After before trying again; 5xx backs off exponentially', { timeout: 30_000 }, async (t) => {
  const { fake, source } = await start(t, {}, { restartBackoff: { baseMs: 200, maxMs: 5000 } }, {
    waitSynced: false,
    before: (f) => {
      f.fail({ status: 429, verb: 'list', retryAfterSeconds: 1, times: 1 });
      f.fail({ status: 503, verb: 'list', times: 2 });
    },
  });
  await waitFor('not synced while the list fails', () => source.status().lastError !== undefined);
  assert.equal(source.status().synced, false);
  assert.match(source.status().lastError!, /shedding load \(429/);
  await source.synced();
  const lists = vmiCalls(fake, 'list');
  assert.deepEqual(lists.map((l) => l.status), [429, 503, 503, 200]);
  const gaps = lists.slice(1).map((l, i) => l.at - lists[i]!.at);
  // Lower bounds only: the backoff waits at least this long.
  assert.ok(gaps[0]! >= 950, `Retry-After 1s honoured over a 200 ms backoff (waited ${gaps[0]} ms)`);
  assert.ok(gaps[1]! >= 380 && gaps[2]! >= 780, `exponential backoff after 5xx (${gaps.join(', ')} ms)`);
  await waitFor('watching', () => source.status().connected);
  assert.equal(source.status().lastError, undefined);
});

test('namespaced mode: one informer per namespace on namespaced paths, synced when all are, nothing from other namespaces', { timeout: 30_000 }, async (t) => {
  const { fake, source } = await start(t, { rbac: namespacedRbac(['team-a', 'team-b']) }, { namespaces: ['team-a', 'team-b'], restartBackoff: { baseMs: 300, maxMs: 300 } }, {
    waitSynced: false,
    before: (f) => {
      for (const ns of ['team-a', 'team-b', 'team-c']) f.applyVmi(vmi(`vm-${ns}`, { namespace: ns }));
      f.applyVmi(vmi('elsewhere', { namespace: 'team-a', node: 'node-b' }));
      f.fail({ status: 503, path: /\/namespaces\/team-b\/virtualmachineinstances$/, verb: 'list', times: 2 });
    },
  });
  await waitFor('team-a listed', () => vmiCalls(fake, 'list').some((r) => r.namespace === 'team-a' && r.status === 200));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(source.status().synced, false, 'not synced while team-b fails');
  assert.match(source.status().lastError ?? '', /^namespace team-b: .*503/);
  await source.synced();
  assert.deepEqual(source.keys().sort(), ['team-a/vm-team-a', 'team-b/vm-team-b']);
  assert.equal(source.get('team-c/vm-team-c'), undefined);
  fake.applyVmi(vmi('late', { namespace: 'team-b' }));
  fake.applyVmi(vmi('late', { namespace: 'team-c' }));
  await waitFor('a watched namespace', () => source.get('team-b/late'));
  await waitFor('both watching', () => source.status().connected);
  const vmiPaths = fake.requests.filter((r) => r.resource === 'virtualmachineinstances');
  for (const r of vmiPaths) {
    assert.match(r.path, /^\/apis\/kubevirt\.io\/v1\/namespaces\/team-[ab]\/virtualmachineinstances$/);
    assert.equal(r.query.labelSelector, `kubevirt.io/nodeName=${NODE}`);
  }
  assert.ok(vmiPaths.every((r) => r.status !== 403), 'Roles in the two namespaces suffice');
  assert.equal(source.get('team-c/late'), undefined);
});

test('cluster-wide mode against namespaced Roles only: the list is forbidden at the cluster scope, and says so', { timeout: 30_000 }, async (t) => {
  const { source } = await start(t, { rbac: namespacedRbac(['team-a']) }, {}, { waitSynced: false });
  await waitFor('an error', () => source.status().lastError);
  assert.match(
    source.status().lastError!,
    /403 to GET \/apis\/kubevirt\.io\/v1\/virtualmachineinstances \(virtualmachineinstances\.kubevirt\.io is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot list resource "virtualmachineinstances" in API group "kubevirt\.io" at the cluster scope\)/,
  );
  assert.equal(source.status().synced, false);
});

test('a watch answered 429 is retried after its Retry-After, from its resourceVersion', { timeout: 30_000 }, async (t) => {
  const { fake, source } = await start(t, {}, { restartBackoff: { baseMs: 50, maxMs: 50 } });
  fake.fail({ status: 429, verb: 'watch', retryAfterSeconds: 1 });
  fake.dropWatches();
  fake.applyVmi(vmi('while-throttled'));
  await waitFor('the change arrives', () => source.get('default/while-throttled'), 10_000);
  const watches = vmiCalls(fake, 'watch');
  const throttled = watches.findIndex((w) => w.status === 429);
  assert.ok(throttled > 0);
  const next = watches[throttled + 1]!;
  assert.ok(next.at - watches[throttled]!.at >= 950, `waited ${next.at - watches[throttled]!.at} ms`);
  assert.equal(next.query.resourceVersion, watches[throttled]!.query.resourceVersion);
  assert.equal(vmiCalls(fake, 'list').length, 1);
});

test('a rotated token: the next watch gets 401, the token file is re-read, the watch resumes without a relist', { timeout: 30_000 }, async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const file = join(dir.path, 'token');
  await writeFile(file, 'old-token');
  const { fake, source } = await start(t, { tokens: ['old-token'] }, { restartBackoff: { baseMs: 50, maxMs: 50 } }, {
    connect: (f) => new KubeConnection({ server: f.url, ca: f.caCert!, tokenFile: file }),
  });
  await writeFile(file, 'new-token');
  fake.acceptTokens('new-token');
  fake.dropWatches();
  fake.applyVmi(vmi('after-rotation'));
  await waitFor('the change arrives', () => source.get('default/after-rotation'), 10_000);
  assert.deepEqual(vmiCalls(fake, 'watch').map((w) => w.status), [200, 401, 200]);
  assert.equal(vmiCalls(fake, 'list').length, 1);
});
