// How many connections the watches of referenced objects cost: over
// HTTP/2 (what the API server offers) every watch and read of the agent
// shares one connection, as kubelet's do; over HTTP/1.1 (a server or proxy
// that does not speak HTTP/2) each open watch holds a connection of its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { H2_MAX_STREAMS } from '../../src/kube/connection.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { ObjectWatches } from '../../src/kube/object-watches.ts';
import { BoundedWatch } from '../../src/kube/watch.ts';
import { FakeKube } from '../support/fake-kube.ts';
import { startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';

const SECRETS = 20;

async function agentWithSecrets(t: { after(fn: () => Promise<void>): void }, http2: boolean | number) {
  const fake = await FakeKube.start({ http2 });
  const dir = await tempDir();
  t.after(async () => {
    await fake.close();
    await dir.remove();
  });
  const h = await startAgent(fake, { stateDir: dir.path, resyncPeriodMs: 3_600_000 });
  t.after(h.stop);
  for (let i = 0; i < SECRETS; i++) {
    fake.setSecret({ metadata: { name: `s${i}`, namespace: 'default' }, stringData: { userdata: `#cloud-config\n` } });
    fake.applyVmi(vmi(`vm-${i}`, { cloudInit: `secretRef: {name: s${i}}\n` }));
  }
  await waitFor(
    'every VMI seeded',
    () =>
      Array.from({ length: SECRETS }, (_, i) => h.agent.status.get(`default/vm-${i}`)?.state).every(
        (s) => s === 'ready',
      ),
    60_000,
  );
  await waitFor('a watch per Secret', () => fake.objectWatchCount() === SECRETS, 30_000);
  return { fake, h };
}

test(
  `over HTTP/2, ${SECRETS} Secret watches and the VMI watches share one connection`,
  { timeout: 90_000 },
  async (t) => {
    const { fake, h } = await agentWithSecrets(t, true);
    const watches = fake.requests.filter((r) => r.verb === 'watch');
    assert.ok(watches.length >= SECRETS + 2);
    assert.ok(
      watches.every((r) => r.httpVersion === '2.0'),
      'every watch over HTTP/2',
    );
    assert.equal(fake.connectionCount(), 1);

    // A watch stopped (its VMI gone) ends its stream, not the connection.
    fake.deleteVmi('default', 'vm-0');
    await waitFor('one watch fewer', () => fake.objectWatchCount() === SECRETS - 1, 30_000);
    assert.equal(h.watches?.openWatches, SECRETS - 1);
    assert.equal(fake.connectionCount(), 1);

    // An edit still arrives on its stream.
    const before = h.agent.status.get('default/vm-1')?.imagePath;
    fake.setSecret({
      metadata: { name: 's1', namespace: 'default' },
      stringData: { userdata: '#cloud-config\nhostname: edited\n' },
    });
    await waitFor('vm-1 reseeded', () => h.agent.status.get('default/vm-1')?.imagePath !== before, 30_000);
  },
);

test(`over HTTP/1.1, each of ${SECRETS} Secret watches holds a connection`, { timeout: 90_000 }, async (t) => {
  const { fake } = await agentWithSecrets(t, false);
  assert.ok(fake.requests.every((r) => r.httpVersion === '1.1'));
  // The Secret watches, the two VMI watches; reads reuse idle ones.
  assert.ok(fake.connectionCount() >= SECRETS + 2, `${fake.connectionCount()} connections`);
});

test(
  'a server that allows fewer streams per connection gets more connections, no watch left waiting',
  { timeout: 90_000 },
  async (t) => {
    const { fake } = await agentWithSecrets(t, 8);
    const n = fake.connectionCount();
    t.diagnostic(`${n} connections for ${SECRETS} Secret watches and 2 VMI watches at 8 streams each`);
    assert.ok(n >= Math.ceil((SECRETS + 2) / 8) && n <= SECRETS, `${n} connections`);
  },
);

test(`one HTTP/2 connection carries up to ${H2_MAX_STREAMS} watches`, { timeout: 90_000 }, async (t) => {
  const fake = await FakeKube.start({ http2: true }); // Node's server: no limit of its own
  t.after(() => fake.close());
  const connection = fake.connection();
  const watches = new ObjectWatches({
    api: new KubeConnectionApi(connection, { timeoutMs: 10_000 }),
    watcher: new BoundedWatch({ connection }),
    logger: pino({ level: 'silent' }),
    maxPerVmi: H2_MAX_STREAMS,
  });
  t.after(async () => {
    await watches.stop();
    await connection.close();
  });
  // More than undici's own default of 100 streams per connection.
  const n = 150;
  const reader = watches.reader('ns/many');
  for (let i = 0; i < n; i++) {
    fake.setSecret({ metadata: { name: `m${i}`, namespace: 'default' }, stringData: { k: 'v' } });
    await reader.getSecret('default', `m${i}`);
  }
  watches.use('ns/many', reader.read());
  reader.done();
  await waitFor(`${n} watches open`, () => fake.objectWatchCount() === n, 60_000);
  assert.equal(fake.connectionCount(), 1);
});
