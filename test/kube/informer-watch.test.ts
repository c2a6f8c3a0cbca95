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
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { KubeConnection } from '../../src/kube/connection.ts';
import { tempDir } from '../support/agent-harness.ts';
import { KubeVmiSource, newerVmi, type KubeSourceOptions } from '../../src/kube/kube-vmi-source.ts';

async function start(
  t: { after(fn: () => Promise<void>): void },
  fakeOptions: FakeKubeOptions,
  options: Partial<KubeSourceOptions> = {},
  {
    waitSynced = true,
    before,
    connect,
  }: { waitSynced?: boolean; before?: (fake: FakeKube) => void; connect?: (fake: FakeKube) => KubeConnection } = {},
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

const ON_NODE = `kubevirt.io/nodeName=${NODE}`;
const MIGRATING_HERE = `kubevirt.io/migrationTargetNodeName=${NODE}`;
// The node watch's calls (each scope also has a migration-target watch).
const vmiCalls = (fake: FakeKube, verb: 'list' | 'watch', labelSelector = ON_NODE): RequestRecord[] =>
  fake.requests.filter(
    (r) => r.resource === 'virtualmachineinstances' && r.verb === verb && r.query.labelSelector === labelSelector,
  );

test(
  'watches ask for timeoutSeconds in [min, 2*min]; the server ends them; each renewal resumes from its resourceVersion: no relist, no event lost',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source, keys } = await start(t, {}, { minWatchTimeoutMs: 1000 });
    const names: string[] = [];
    // A change in every gap between a watch's end and the next one.
    let gap = 0;
    fake.afterWatchTimeout((selector) => {
      if (selector !== ON_NODE) return;
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
    await waitFor('every VMI seen', () => names.every((n) => source.get(`default/${n}`)), 20_000);
    assert.deepEqual(
      [...new Set(keys)].sort(),
      names.map((n) => `default/${n}`).sort(),
      'every VMI enqueued, none of the other node',
    );
    const watches = vmiCalls(fake, 'watch');
    assert.equal(vmiCalls(fake, 'list').length, 1, 'renewals never relist');
    assert.equal(vmiCalls(fake, 'list', MIGRATING_HERE).length, 1, 'nor does the migration-target watch');
    for (const w of [...watches, ...vmiCalls(fake, 'watch', MIGRATING_HERE)]) {
      assert.ok(['1', '2'].includes(w.query.timeoutSeconds), `timeoutSeconds ${w.query.timeoutSeconds}`);
      assert.equal(w.query.allowWatchBookmarks, 'true');
      assert.match(w.query.resourceVersion ?? '', /^[1-9]\d*$/, 'from a resourceVersion, never from "now" or 0');
    }
    const rvs = watches.map((w) => Number(w.query.resourceVersion));
    assert.deepEqual(
      rvs,
      [...rvs].sort((a, b) => a - b),
      'resourceVersions only move forward',
    );
    assert.equal(source.status().restarts, 0);
    assert.equal(source.status().connected, true);
  },
);

test(
  'a watch the server never ends is cut past timeoutSeconds + grace and renewed from its resourceVersion',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source, lines } = await start(t, {}, { minWatchTimeoutMs: 1000, watchGraceMs: 300 });
    fake.honourWatchTimeouts(false);
    fake.applyVmi(vmi('before'));
    // The first watch was opened before honourWatchTimeouts(false); wait for one that the server will not end.
    const firstIgnored = await waitFor(
      'a watch the server ignores the timeout of',
      () => vmiCalls(fake, 'watch').length >= 2 && vmiCalls(fake, 'watch').length,
      20_000,
    );
    await waitFor('renewed by the client', () => vmiCalls(fake, 'watch').length > firstIgnored, 20_000);
    assert.ok(
      lines.some((l) => l.includes('ran past its timeout')),
      'the cut is logged',
    );
    await waitFor(
      'the cut watches closed on the server side too: one node watch and one migration-target watch open',
      () => fake.watchCount() === 2,
      20_000,
    );
    fake.applyVmi(vmi('after'));
    await waitFor('an event on the renewed watch', () => source.get('default/after'), 20_000);
    assert.equal(vmiCalls(fake, 'list').length, 1, 'no relist');
    assert.equal(source.status().restarts, 0);
  },
);

test(
  'a list answered 429 waits the Retry-After before trying again; 5xx backs off exponentially',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source } = await start(
      t,
      {},
      { restartBackoff: { baseMs: 200, maxMs: 5000 } },
      {
        waitSynced: false,
        before: (f) => {
          f.fail({ status: 429, verb: 'list', labelSelector: ON_NODE, retryAfterSeconds: 1, times: 1 });
          f.fail({ status: 503, verb: 'list', labelSelector: ON_NODE, times: 2 });
        },
      },
    );
    await waitFor('not synced while the list fails', () => source.status().lastError !== undefined);
    assert.equal(source.status().synced, false);
    assert.match(source.status().lastError!, /shedding load \(429/);
    await source.synced();
    const lists = vmiCalls(fake, 'list');
    assert.deepEqual(
      lists.map((l) => l.status),
      [429, 503, 503, 200],
    );
    const gaps = lists.slice(1).map((l, i) => l.at - lists[i].at);
    // Lower bounds only: the backoff waits at least this long.
    assert.ok(gaps[0] >= 950, `Retry-After 1s honoured over a 200 ms backoff (waited ${gaps[0]} ms)`);
    assert.ok(gaps[1] >= 380 && gaps[2] >= 780, `exponential backoff after 5xx (${gaps.join(', ')} ms)`);
    await waitFor('watching', () => source.status().connected);
    assert.equal(source.status().lastError, undefined);
  },
);

test(
  'namespaced mode: one informer per namespace on namespaced paths, synced when all are, nothing from other namespaces',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source } = await start(
      t,
      { rbac: namespacedRbac(['team-a', 'team-b']) },
      { namespaces: ['team-a', 'team-b'], restartBackoff: { baseMs: 1000, maxMs: 1000 } },
      {
        waitSynced: false,
        before: (f) => {
          for (const ns of ['team-a', 'team-b', 'team-c']) f.applyVmi(vmi(`vm-${ns}`, { namespace: ns }));
          f.applyVmi(vmi('elsewhere', { namespace: 'team-a', node: 'node-b' }));
          f.fail({
            status: 503,
            path: /\/namespaces\/team-b\/virtualmachineinstances$/,
            verb: 'list',
            labelSelector: ON_NODE,
            times: 2,
          });
        },
      },
    );
    const listed = (ns: string) => vmiCalls(fake, 'list').some((r) => r.namespace === ns && r.status === 200);
    const failing = () => /^namespace team-b: .*503/.test(source.status().lastError ?? '');
    await waitFor('team-a listed, team-b refused', () => listed('team-a') && (failing() || listed('team-b')));
    // Checked only while team-b has not been listed yet (read in the same
    // tick): a starved test process may look after its retries succeeded.
    if (!listed('team-b')) {
      assert.equal(source.status().synced, false, 'not synced while team-b fails');
      assert.ok(failing(), source.status().lastError);
    }
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
      assert.ok([ON_NODE, MIGRATING_HERE].includes(r.query.labelSelector), r.query.labelSelector);
    }
    assert.deepEqual(
      new Set(vmiPaths.filter((r) => r.verb === 'watch').map((r) => `${r.namespace} ${r.query.labelSelector}`)),
      new Set(['team-a', 'team-b'].flatMap((ns) => [`${ns} ${ON_NODE}`, `${ns} ${MIGRATING_HERE}`])),
      'both watches in each namespace',
    );
    assert.ok(
      vmiPaths.every((r) => r.status !== 403),
      'Roles in the two namespaces suffice',
    );
    assert.equal(source.get('team-c/late'), undefined);
  },
);

test(
  'cluster-wide mode against namespaced Roles only: the list is forbidden at the cluster scope, and says so',
  { timeout: 30_000 },
  async (t) => {
    const { source } = await start(t, { rbac: namespacedRbac(['team-a']) }, {}, { waitSynced: false });
    await waitFor('an error', () => source.status().lastError);
    assert.match(
      source.status().lastError!,
      /403 to GET \/apis\/kubevirt\.io\/v1\/virtualmachineinstances \(virtualmachineinstances\.kubevirt\.io is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot list resource "virtualmachineinstances" in API group "kubevirt\.io" at the cluster scope\)/,
    );
    assert.equal(source.status().synced, false);
  },
);

test(
  'a watch answered 429 is retried after its Retry-After, from its resourceVersion',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source } = await start(t, {}, { restartBackoff: { baseMs: 50, maxMs: 50 } });
    fake.fail({ status: 429, verb: 'watch', labelSelector: ON_NODE, retryAfterSeconds: 1 });
    fake.dropWatches();
    fake.applyVmi(vmi('while-throttled'));
    await waitFor('the change arrives', () => source.get('default/while-throttled'), 20_000);
    const watches = vmiCalls(fake, 'watch');
    const throttled = watches.findIndex((w) => w.status === 429);
    assert.ok(throttled > 0);
    const next = watches[throttled + 1];
    assert.ok(next.at - watches[throttled].at >= 950, `waited ${next.at - watches[throttled].at} ms`);
    assert.equal(next.query.resourceVersion, watches[throttled].query.resourceVersion);
    assert.equal(vmiCalls(fake, 'list').length, 1);
  },
);

test(
  'a rotated token: the next watch gets 401, the token file is re-read, the watch resumes without a relist',
  { timeout: 30_000 },
  async (t) => {
    const dir = await tempDir();
    t.after(() => dir.remove());
    const file = join(dir.path, 'token');
    await writeFile(file, 'old-token');
    const { fake, source } = await start(
      t,
      { tokens: ['old-token'] },
      { restartBackoff: { baseMs: 50, maxMs: 50 } },
      {
        connect: (f) => new KubeConnection({ server: f.url, ca: f.caCert!, tokenFile: file }),
      },
    );
    await writeFile(file, 'new-token');
    fake.acceptTokens('new-token');
    fake.dropWatches();
    fake.applyVmi(vmi('after-rotation'));
    await waitFor('the change arrives', () => source.get('default/after-rotation'), 20_000);
    // Both watches were dropped and came back; whichever met the old token
    // first had it re-read, the other may have come back after that.
    // The change may arrive through one watch while the other is still
    // between its 401 and its retry: wait for both to be watching again.
    const statusesNow = () => [ON_NODE, MIGRATING_HERE].map((sel) => vmiCalls(fake, 'watch', sel).map((w) => w.status));
    const byWatch = await waitFor(
      'both watches back',
      () => {
        const b = statusesNow();
        return b.every((s) => s.at(-1) === 200) && b;
      },
      20_000,
    );
    assert.ok(byWatch.flat().includes(401), `a 401 met: ${JSON.stringify(byWatch)}`);
    for (const statuses of byWatch)
      assert.ok(
        [
          [200, 401, 200],
          [200, 200],
        ].some((ok) => JSON.stringify(ok) === JSON.stringify(statuses)),
        JSON.stringify(statuses),
      );
    assert.equal(vmiCalls(fake, 'list').length, 1);
    assert.equal(vmiCalls(fake, 'list', MIGRATING_HERE).length, 1);
  },
);

// KubeVirt's migration controller labels the VMI with the target node as
// soon as the target pod is scheduled (pkg/virt-controller/watch/migration,
// MigrationTargetNodeNameLabel); kubevirt.io/nodeName names the source
// until the migration ends.
function migrating(name: string, from: string, to: string | undefined, extra: Record<string, string> = {}) {
  const v = vmi(name, { node: from });
  v.metadata.labels = { ...v.metadata.labels, ...(to ? { 'kubevirt.io/migrationTargetNodeName': to } : {}) };
  v.metadata.annotations = { ...v.metadata.annotations, ...extra };
  return v;
}

test(
  'a VMI migrating here from another node is seen through kubevirt.io/migrationTargetNodeName, kept across the hand-over, dropped when the migration fails',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source, keys } = await start(t, {});
    fake.applyVmi(migrating('elsewhere', 'node-b', 'node-c'));
    fake.applyVmi(migrating('incoming', 'node-b', NODE));
    await waitFor('the incoming VMI in the cache', () => source.get('default/incoming'), 20_000);
    assert.equal(source.get('default/elsewhere'), undefined, 'a migration between two other nodes is not seen');
    assert.ok(keys.includes('default/incoming'));

    // The migration completes: KubeVirt moves kubevirt.io/nodeName here, then
    // the target's virt-handler drops the target label. Both watches hold it
    // in between: one key, the latest version.
    fake.applyVmi(migrating('incoming', NODE, NODE, { step: 'both-labels' }));
    await waitFor(
      'the latest version while both caches hold it',
      () => source.get('default/incoming')?.metadata.annotations?.step === 'both-labels',
      20_000,
    );
    assert.deepEqual(
      source.keys().filter((k) => k === 'default/incoming'),
      ['default/incoming'],
      'one key, not one per watch',
    );
    const before = keys.length;
    fake.applyVmi(migrating('incoming', NODE, undefined, { step: 'node-only' }));
    await waitFor(
      'the hand-over seen',
      () => keys.length > before && source.get('default/incoming')?.metadata.annotations?.step === 'node-only',
      20_000,
    );

    // A migration here that fails: the target label goes, the VMI stays on its node.
    fake.applyVmi(migrating('failing', 'node-b', NODE));
    await waitFor('the failing one seen', () => source.get('default/failing'), 20_000);
    const enqueued = keys.filter((k) => k === 'default/failing').length;
    fake.applyVmi(migrating('failing', 'node-b', undefined));
    await waitFor(
      'gone from the cache, and enqueued so its staged copy is removed',
      () =>
        source.get('default/failing') === undefined && keys.filter((k) => k === 'default/failing').length > enqueued,
      20_000,
    );
    assert.equal(source.status().connected, true);
  },
);

test(
  'a migration-target watch that fails is reported as such, and the node is not synced until it lists',
  { timeout: 30_000 },
  async (t) => {
    const { fake, source } = await start(
      t,
      {},
      { restartBackoff: { baseMs: 100, maxMs: 100 } },
      {
        waitSynced: false,
        before: (f) => f.fail({ status: 503, verb: 'list', labelSelector: MIGRATING_HERE, times: 2 }),
      },
    );
    await waitFor('the error', () => source.status().lastError, 20_000);
    assert.match(source.status().lastError!, /^migration-target watch: .*503/);
    assert.equal(source.status().synced, false);
    await source.synced();
    assert.deepEqual(
      vmiCalls(fake, 'list', MIGRATING_HERE).map((r) => r.status),
      [503, 503, 200],
    );
  },
);

test("newerVmi: the copy with the later resourceVersion; the node watch's copy when they cannot be compared", () => {
  const at = (rv: string | undefined, tag: string) => ({
    ...vmi('x'),
    metadata: { ...vmi('x').metadata, ...(rv === undefined ? {} : { resourceVersion: rv }), annotations: { tag } },
  });
  assert.equal(
    newerVmi(at('9', 'node'), at('10', 'target'))?.metadata.annotations?.tag,
    'target',
    'numerically, not as strings',
  );
  assert.equal(newerVmi(at('11', 'node'), at('10', 'target'))?.metadata.annotations?.tag, 'node');
  assert.equal(
    newerVmi(at('12345678901234567890', 'node'), at('2', 'target'))?.metadata.annotations?.tag,
    'node',
    'too long to be a revision: not compared',
  );
  assert.equal(newerVmi(at('a1', 'node'), at('b2', 'target'))?.metadata.annotations?.tag, 'node');
  assert.equal(newerVmi(undefined, at('1', 'target'))?.metadata.annotations?.tag, 'target');
  assert.equal(newerVmi(at(undefined, 'node'), undefined)?.metadata.annotations?.tag, 'node');
  assert.equal(newerVmi(undefined, undefined), undefined);
});
