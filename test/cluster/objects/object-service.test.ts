// The node-scoped object service against the fake API server: TokenReview
// names the node, a VMI on that node must reference the object, and the
// agent's own client code (ObjectWatches, KubeRefResolver, BoundedWatch)
// reads and watches through it unchanged.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import type { SecretObject, VmiObject } from '../../../src/api/objects.ts';
import { KubeConnectionApi } from '../../../src/kube/api-client.ts';
import { KubeConnection } from '../../../src/kube/connection.ts';
import { ObjectWatches } from '../../../src/kube/object-watches.ts';
import { KubeRefResolver } from '../../../src/kube/resolver.ts';
import { BoundedWatch } from '../../../src/kube/watch.ts';
import { startObjectService, type ObjectService } from '../../../src/cluster/objects/object-server.ts';
import { FakeKube } from '../../support/fake-kube.ts';
import { testPki, type TestPki } from '../../support/test-pki.ts';
import { vmi, waitFor } from '../../support/agent-harness.ts';
import { captureLogger } from '../../support/capture-logger.ts';

const AGENT = 'system:serviceaccount:vmseed:vmseed';
const ADMIN = 'admin-token';
const NS = 'tenant';

const secret = (name: string, hostname: string, namespace = NS): SecretObject => ({
  metadata: { name, namespace },
  stringData: { userdata: `#cloud-config\nhostname: ${hostname}\n` },
});

const onNode = (name: string, node: string, ref: string): VmiObject =>
  vmi(name, { namespace: NS, node, cloudInit: `secretRef: {name: ${ref}}\n` });

function register(fake: FakeKube, token: string, node: string, extra: Record<string, string[]> = {}): void {
  fake.registerReviewToken(token, {
    username: AGENT,
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/node-name': [node], ...extra },
  });
}

interface Setup {
  fake: FakeKube;
  pki: TestPki;
  service: ObjectService;
  start(port?: number): Promise<ObjectService>;
  client(token: string): { conn: KubeConnection; api: KubeConnectionApi };
}

async function setup(t: TestContext): Promise<Setup> {
  const fake = await FakeKube.start({ adminTokens: [ADMIN] });
  const pki = await testPki('vmseed-objects');
  const upstream = fake.connection(ADMIN);
  const { logger } = captureLogger('info');
  const services: ObjectService[] = [];
  const start = async (port = 0) => {
    const s = await startObjectService({
      listen: { host: '127.0.0.1', port },
      tls: { cert: pki.serverCert, key: pki.serverKey },
      connection: upstream,
      api: new KubeConnectionApi(upstream, { retry: { retries: 0 } }),
      logger,
      agentServiceAccount: 'vmseed:vmseed',
      recheckMs: 200,
      tokenTtlMs: 200,
      refusalWaitMs: 100,
    });
    services.push(s);
    return s;
  };
  const service = await start();
  const conns: KubeConnection[] = [];
  t.after(async () => {
    for (const c of conns) await c.close(100);
    for (const s of services) await s.close().catch(() => undefined);
    await upstream.close(100);
    await fake.close();
  });
  return {
    fake,
    pki,
    service,
    start,
    client: (token) => {
      const conn = new KubeConnection({
        server: `https://127.0.0.1:${service.address.port}`,
        token,
        ca: pki.caCert,
      });
      conns.push(conn);
      return { conn, api: new KubeConnectionApi(conn, { retry: { retries: 0 } }) };
    },
  };
}

test('a node reads only what its VMIs reference; tokens are checked', { timeout: 60_000 }, async (t) => {
  const s = await setup(t);
  const { fake } = s;
  fake.setSecret(secret('a-data', 'a'));
  fake.setSecret(secret('b-data', 'b'));
  fake.setSecret(secret('unreferenced', 'x'));
  fake.applyVmi(onNode('vm-a', 'node-a', 'a-data'));
  fake.applyVmi(onNode('vm-b', 'node-b', 'b-data'));
  register(fake, 'tok-a', 'node-a');
  fake.registerReviewToken('tok-wrong-audience', {
    username: AGENT,
    audiences: ['https://kubernetes.default.svc'],
    extra: { 'authentication.kubernetes.io/node-name': ['node-a'] },
  });
  fake.registerReviewToken('tok-other-sa', {
    username: 'system:serviceaccount:tenant:default',
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/node-name': ['node-a'] },
  });
  // Before 1.30: no node-name in the review, the bound pod tells it.
  fake.registerReviewToken('tok-pod', {
    username: AGENT,
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/pod-name': ['vmseed-abc'], 'authentication.kubernetes.io/pod-uid': ['u-1'] },
  });
  fake.setPod('vmseed', 'vmseed-abc', 'u-1', 'node-a');
  fake.registerReviewToken('tok-pod-replaced', {
    username: AGENT,
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/pod-name': ['vmseed-abc'], 'authentication.kubernetes.io/pod-uid': ['u-0'] },
  });
  await waitFor('VMIs listed', () => s.service.problem() === undefined);

  const a = s.client('tok-a').api;
  const got = await a.request('GET', `/api/v1/namespaces/${NS}/secrets/a-data`);
  assert.equal(got.status, 200);
  assert.equal((got.body as SecretObject).metadata.name, 'a-data');
  assert.ok((got.body as SecretObject).data?.userdata, 'the object as the API server has it');

  const refused = async (api: KubeConnectionApi, path: string, code: number) => {
    const r = await api.request('GET', path);
    assert.equal(r.status, code, `${path}: ${JSON.stringify(r.body)}`);
    assert.equal((r.body as { kind?: string }).kind, 'Status');
  };
  await refused(a, `/api/v1/namespaces/${NS}/secrets/b-data`, 403);
  await refused(a, `/api/v1/namespaces/${NS}/secrets/unreferenced`, 403);
  await refused(a, `/api/v1/namespaces/${NS}/secrets`, 403);
  await refused(a, `/api/v1/namespaces/${NS}/secrets?watch=true`, 403);
  await refused(a, `/api/v1/namespaces/${NS}/configmaps?watch=1&labelSelector=x`, 403);
  await refused(a, `/api/v1/namespaces/other/secrets/a-data`, 403);
  await refused(a, '/api/v1/pods', 403);
  await refused(a, '/healthz', 404);
  const put = await a.request('PUT', `/api/v1/namespaces/${NS}/secrets/a-data`, {});
  assert.equal(put.status, 403);

  for (const token of ['tok-wrong-audience', 'not-a-token', 'tok-pod-replaced'])
    await refused(s.client(token).api, `/api/v1/namespaces/${NS}/secrets/a-data`, 401);
  await refused(s.client('tok-other-sa').api, `/api/v1/namespaces/${NS}/secrets/a-data`, 403);
  const pod = await s.client('tok-pod').api.request('GET', `/api/v1/namespaces/${NS}/secrets/a-data`);
  assert.equal(pod.status, 200, 'node from the bound pod');

  // A watch without a name is refused; one of a referenced name is served.
  const b = s.client('tok-a');
  const watchStatus = await new Promise<number | undefined>((resolve) => {
    void new BoundedWatch({ connection: b.conn }).watch(
      `/api/v1/namespaces/${NS}/secrets`,
      {},
      () => undefined,
      (err) => resolve((err as { statusCode?: number } | null)?.statusCode),
    );
  });
  assert.equal(watchStatus, 403);

  // The migration target may read the VMI's objects while it migrates.
  const migrating = onNode('vm-m', 'node-b', 'm-data');
  fake.setSecret(secret('m-data', 'm'));
  migrating.status = { ...migrating.status, migrationState: { targetNode: 'node-a' } };
  fake.applyVmi(migrating);
  await waitFor('migration seen', async () => {
    const r = await a.request('GET', `/api/v1/namespaces/${NS}/secrets/m-data`);
    return r.status === 200;
  });

  // The upstream reads are the cluster component's, never the node's token.
  assert.ok(fake.requests.filter((r) => r.resource === 'secrets').every((r) => r.user !== fake.user));
});

test(
  'edits reach the agent through the service; it keeps its data while the service is down',
  { timeout: 60_000 },
  async (t) => {
    const s = await setup(t);
    const { fake } = s;
    fake.setSecret(secret('a-data', 'one'));
    fake.applyVmi(onNode('vm-a', 'node-a', 'a-data'));
    register(fake, 'tok-a', 'node-a');
    await waitFor('VMIs listed', () => s.service.problem() === undefined);
    const { conn, api } = s.client('tok-a');
    const changes: number[] = [];
    const watches = new ObjectWatches({
      api,
      watcher: new BoundedWatch({ connection: conn }),
      logger: pino({ level: 'silent' }),
      backoff: { baseMs: 100, maxMs: 300 },
    });
    t.after(() => watches.stop());
    watches.onChange(() => changes.push(performance.now()));
    const read = async (key: string, name: string) => {
      const r = watches.reader(key);
      try {
        const o = await r.getSecret(NS, name);
        watches.use(key, r.read());
        return o;
      } finally {
        r.done();
      }
    };
    const first = await read(`${NS}/vm-a`, 'a-data');
    assert.ok(first?.data?.userdata);
    await waitFor('watch open through the service', () => s.service.watches().get('node-a') === 1);

    const editedAt = performance.now();
    fake.setSecret(secret('a-data', 'two'));
    await waitFor('edit reached the agent', () => changes.length > 0, 5_000);
    t.diagnostic(`edit → agent notification through the service: ${(changes[0] - editedAt).toFixed(1)} ms`);
    const second = await read(`${NS}/vm-a`, 'a-data');
    assert.notEqual(second?.metadata.resourceVersion, first?.metadata.resourceVersion);

    // The service goes away: what the agent had stays served from its cache.
    const port = s.service.address.port;
    await s.service.close();
    const cached = await read(`${NS}/vm-a`, 'a-data');
    assert.equal(cached?.metadata.resourceVersion, second?.metadata.resourceVersion);
    // A new VMI's data was never read: its read fails (retryable) until the service is back.
    fake.setSecret(secret('a2-data', 'new'));
    fake.applyVmi(onNode('vm-a2', 'node-a', 'a2-data'));
    await assert.rejects(read(`${NS}/vm-a2`, 'a2-data'), (e: { code?: string; kind?: string }) => {
      assert.equal(e.code, 'KUBE_API_UNAVAILABLE');
      assert.equal(e.kind, 'retryable');
      return true;
    });
    const back = await s.start(port);
    await waitFor('VMIs listed again', () => back.problem() === undefined);
    const fresh = await waitFor('the new VMI read once the service is back', async () => {
      try {
        return await read(`${NS}/vm-a2`, 'a2-data');
      } catch {
        return undefined;
      }
    });
    assert.equal(fresh?.metadata.name, 'a2-data');
    // The old watch renewed itself: later edits arrive again.
    await waitFor('watches renewed', () => back.watches().get('node-a') === 2, 10_000);
    const n = changes.length;
    fake.setSecret(secret('a-data', 'three'));
    await waitFor('edit after the outage reached the agent', () => changes.length > n, 5_000);

    // KubeRefResolver (a reconcile outside the cache) reads the same way.
    const direct = await new KubeRefResolver(api).getSecret(NS, 'a2-data');
    assert.equal(direct?.metadata.name, 'a2-data');
  },
);

test('a watch ends once its object is no longer referenced from the node', { timeout: 30_000 }, async (t) => {
  const s = await setup(t);
  const { fake } = s;
  fake.setSecret(secret('a-data', 'one'));
  fake.applyVmi(onNode('vm-a', 'node-a', 'a-data'));
  register(fake, 'tok-a', 'node-a');
  await waitFor('VMIs listed', () => s.service.problem() === undefined);
  const { conn } = s.client('tok-a');
  const ended = new Promise<unknown>((resolve) => {
    void new BoundedWatch({ connection: conn }).watch(
      `/api/v1/namespaces/${NS}/secrets`,
      { fieldSelector: 'metadata.name=a-data' },
      () => undefined,
      resolve,
    );
  });
  await waitFor('watch open', () => s.service.watches().get('node-a') === 1);
  fake.deleteVmi(NS, 'vm-a');
  assert.equal(await ended, null, 'ended cleanly, as at a timeout');
  assert.equal(s.service.watches().get('node-a'), undefined);
});

test(
  'unpause on behalf: only a VMI that runs on the node asking, never a migration target',
  { timeout: 30_000 },
  async (t) => {
    const s = await setup(t);
    const { fake } = s;
    const paused = (name: string, node: string): VmiObject => {
      const v = onNode(name, node, 'none');
      v.spec.startStrategy = 'Paused';
      v.status = {
        ...v.status,
        phase: 'Running',
        conditions: [{ type: 'Paused', status: 'True', reason: 'PausedByUser' }],
      };
      return v;
    };
    fake.applyVmi(paused('own', 'node-a'));
    fake.applyVmi(paused('theirs', 'node-b'));
    const moving = paused('moving', 'node-b');
    moving.status = { ...moving.status, migrationState: { targetNode: 'node-a' } };
    fake.applyVmi(moving);
    register(fake, 'tok-a', 'node-a');
    await waitFor('VMIs listed', () => s.service.problem() === undefined);
    const a = s.client('tok-a').api;
    const path = (name: string) =>
      `/apis/subresources.kubevirt.io/v1/namespaces/${NS}/virtualmachineinstances/${name}/unpause`;

    const own = await a.request('PUT', path('own'), {});
    assert.equal(own.status, 200, JSON.stringify(own.body));
    for (const name of ['theirs', 'moving', 'absent']) {
      const r = await a.request('PUT', path(name), {});
      assert.equal(r.status, 403, `${name}: ${JSON.stringify(r.body)}`);
      assert.match((r.body as { message: string }).message, /does not run on node 'node-a'/);
    }
    assert.deepEqual(fake.unpaused, [`${NS}/own`]);
    // Only PUT on the subresource: a GET or another subresource is refused.
    assert.equal((await a.request('GET', path('own'))).status, 403);
    assert.equal(
      (
        await a.request(
          'PUT',
          `/apis/subresources.kubevirt.io/v1/namespaces/${NS}/virtualmachineinstances/own/pause`,
          {},
        )
      ).status,
      403,
    );
    const anonymous = s.client('no-such-token').api;
    assert.equal((await anonymous.request('PUT', path('own'), {})).status, 401);
    const upstream = fake.requests.filter((r) => r.subresource === 'unpause');
    assert.equal(upstream.length, 1, 'only the own VMI reached KubeVirt');
    assert.notEqual(upstream[0].user, fake.user, 'with the component credential, not the node agent one');
  },
);
